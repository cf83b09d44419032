// Narrow screens: the sidebar collapses to a bar with a menu button that
// opens the navigation; choosing a view closes it again.
const sidebar = document.querySelector(".sidebar");
const toggle = document.getElementById("nav-toggle");
if (sidebar && toggle) {
  const set = (open) => {
    sidebar.toggleAttribute("data-open", open);
    toggle.setAttribute("aria-expanded", String(open));
  };
  toggle.addEventListener("click", () => set(!sidebar.hasAttribute("data-open")));
  window.addEventListener("hashchange", () => set(false));
  document.getElementById("nav")?.addEventListener("click", (e) => { if (e.target.closest("a")) set(false); });
  document.addEventListener("keydown", (e) => { if (e.key === "Escape") set(false); });
}
