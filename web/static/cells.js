// beam dashboard: labels for table cells. On a narrow screen a table's
// rows stack as small cards and its header is hidden; each cell then shows
// its column's name (data-label, drawn by the stylesheet) so that no value
// stands there as a bare number.

// labelCells gives every body cell of table the text of its column's
// header as data-label (cells that have one keep it; empty headers give
// none). It returns table.
export function labelCells(table) {
  const names = [...table.querySelectorAll("thead th")].map((th) => th.textContent.trim());
  for (const tr of table.querySelectorAll("tbody tr")) {
    [...tr.children].forEach((td, i) => {
      if (names[i] && td.dataset.label === undefined && !td.hasAttribute("colspan")) td.dataset.label = names[i];
    });
  }
  return table;
}
