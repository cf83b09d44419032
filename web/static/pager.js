// A pager for lists the server returns a page at a time (limit/offset):
// "101–200 of 234" with previous and next buttons.

// PAGE is the page size of the dashboard's lists.
export const PAGE = 100;

// pager returns the pager element for a page at offset of total rows;
// go(offset) is called with the offset of the page to show.
export function pager(id, total, offset, shown, go) {
  const nav = document.createElement("nav");
  nav.className = "pager";
  nav.id = id;
  nav.setAttribute("aria-label", "Pages");
  const from = total ? offset + 1 : 0;
  const to = offset + shown;
  const text = document.createElement("span");
  text.className = "pager-text";
  text.textContent = `${from.toLocaleString()}–${to.toLocaleString()} of ${total.toLocaleString()}`;
  const btn = (label, rel, target, enabled) => {
    const b = document.createElement("button");
    b.type = "button";
    b.className = "btn small";
    b.textContent = label;
    b.dataset.page = rel;
    b.disabled = !enabled;
    b.addEventListener("click", () => go(target));
    return b;
  };
  nav.append(text,
    btn("← Prev", "prev", Math.max(0, offset - PAGE), offset > 0),
    btn("Next →", "next", offset + PAGE, offset + shown < total));
  nav.hidden = total <= PAGE && offset === 0;
  return nav;
}
