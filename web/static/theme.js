// Applies the saved theme before the page paints, and wires every
// [data-theme-toggle] button. Stored in localStorage under "beam-theme":
// "light", "dark" or absent (follow the system).
(function () {
  var KEY = "beam-theme";
  var root = document.documentElement;
  function saved() {
    try { return localStorage.getItem(KEY); } catch (e) { return null; }
  }
  function effective() {
    var t = saved();
    if (t === "light" || t === "dark") return t;
    return window.matchMedia && window.matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light";
  }
  function apply() {
    // The stylesheet keys its palette on data-theme alone, so the
    // attribute always holds the resolved theme (the system's when none
    // is saved).
    var t = effective();
    root.setAttribute("data-theme", t);
    var label = t === "dark" ? "Switch to light theme" : "Switch to dark theme";
    document.querySelectorAll("[data-theme-toggle]").forEach(function (b) {
      b.setAttribute("aria-label", label);
      b.setAttribute("title", label);
      b.setAttribute("data-current", t);
    });
    document.dispatchEvent(new CustomEvent("beam-theme"));
  }
  apply();
  document.addEventListener("DOMContentLoaded", function () {
    apply();
    document.addEventListener("click", function (e) {
      var b = e.target.closest && e.target.closest("[data-theme-toggle]");
      if (!b) return;
      var next = effective() === "dark" ? "light" : "dark";
      try { localStorage.setItem(KEY, next); } catch (err) { /* private mode */ }
      apply();
    });
  });
  if (window.matchMedia) {
    var mq = window.matchMedia("(prefers-color-scheme: dark)");
    if (mq.addEventListener) mq.addEventListener("change", apply);
  }
})();
