// The report page's behaviour: draw each chart from its embedded Vega-Lite spec, and sort every table by a click
// (or Enter) on a column's header. window.__page reports what was drawn, for the browser test and for a reader's
// console.
(function () {
  "use strict";
  const specs = JSON.parse(document.getElementById("chart-specs").textContent);
  const state = {charts: 0, drawn: 0, failed: []};
  window.__page = state;

  // A cell's sort key: its leading number where it starts with one (5.23× [..], 512.1 tok/s, 1,455), else its text.
  function key(cell) {
    const text = cell.innerText.trim();
    const m = text.replace(/,(?=\d{3})/g, "").match(/^[±+]?(-?\d+(?:\.\d+)?(?:e[-+]?\d+)?)/i);
    return m ? {num: parseFloat(m[1]), text} : {num: null, text};
  }
  const collator = new Intl.Collator(undefined, {numeric: true, sensitivity: "base"});
  const BLANK = new Set(["", "–", "-", "—", "nan", "NaN"]);

  function compare(a, b) {
    // blanks last, then numbers before words
    const blankA = BLANK.has(a.text), blankB = BLANK.has(b.text);
    if (blankA || blankB) return blankA - blankB;
    if (a.num !== null && b.num !== null) return a.num - b.num || collator.compare(a.text, b.text);
    if ((a.num === null) !== (b.num === null)) return a.num === null ? 1 : -1;
    return collator.compare(a.text, b.text);
  }

  function sortBy(table, th, index) {
    const body = table.tBodies[0];
    if (!body) return;
    const descending = th.getAttribute("aria-sort") === "ascending";
    for (const other of table.tHead.rows[0].cells) other.removeAttribute("aria-sort");
    const rows = [...body.rows].map((tr, i) => ({tr, i, k: key(tr.cells[index] || tr.cells[0])}));
    rows.sort((a, b) => {
      const blankA = BLANK.has(a.k.text), blankB = BLANK.has(b.k.text);
      if (blankA || blankB) return blankA - blankB || a.i - b.i;  // blanks stay last either way
      return (descending ? -1 : 1) * compare(a.k, b.k) || a.i - b.i;
    });
    for (const r of rows) body.appendChild(r.tr);
    th.setAttribute("aria-sort", descending ? "descending" : "ascending");
  }

  function sortable(table) {
    if (!table.tHead || !table.tHead.rows.length) return;
    if (!table.parentElement.classList.contains("table-wrap")) {
      const wrap = document.createElement("div");
      wrap.className = "table-wrap";
      table.parentNode.insertBefore(wrap, table);
      wrap.appendChild(table);
    }
    table.classList.add("sortable");
    // a short cell (a figure with its interval, a name) stays on one line; the table scrolls inside its frame
    for (const td of table.querySelectorAll("tbody td")) {
      if (td.innerText.trim().length <= 24) td.classList.add("short");
    }
    [...table.tHead.rows[0].cells].forEach((th, index) => {
      th.tabIndex = 0;
      th.title = "Sort by this column";
      th.addEventListener("click", () => sortBy(table, th, index));
      th.addEventListener("keydown", (e) => {
        if (e.key === "Enter" || e.key === " ") { e.preventDefault(); sortBy(table, th, index); }
      });
    });
  }

  document.querySelectorAll("main table").forEach(sortable);

  const drawing = [...document.querySelectorAll(".vega[data-chart]")].map((el) => {
    state.charts += 1;
    const spec = specs[el.dataset.chart];
    // actions off: the menu's "open in editor" would leave the page
    // labelLimit 0: a simulated config's long name is shown whole in the legend
    return vegaEmbed(el, spec, {actions: false, renderer: "svg", tooltip: {theme: "light"},
                                config: {legend: {labelLimit: 0}}})
      .then(() => { state.drawn += 1; })
      .catch((err) => {
        state.failed.push(el.dataset.chart + ": " + err);
        el.textContent = "This chart could not be drawn: " + err;
        console.error("chart " + el.dataset.chart, err);
      });
  });
  Promise.all(drawing).then(() => { document.body.dataset.charts = "done"; });
})();
