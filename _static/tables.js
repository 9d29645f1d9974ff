// The book's tables never scroll sideways with their key column out of sight: a table wider than its column is laid
// out as one card per row instead (custom.css, .msgcore-cards): the key column on top, then each other cell under
// its column's name, which this script copies from the header into each cell's data-label. Tables that fit stay
// tables; the choice is made again when the window changes width.
(() => {
  const CARDS = "msgcore-cards";

  function label(table) {
    const head = table.tHead ? table.tHead.rows : [];
    if (!head.length) return false;
    const names = Array.from(head[head.length - 1].cells, (cell) => cell.textContent.trim());
    Array.from(table.tBodies).forEach((body) => Array.from(body.rows).forEach((row) => {
      Array.from(row.cells).forEach((cell, i) => { if (names[i]) cell.setAttribute("data-label", names[i]); });
    }));
    return true;
  }

  function tooWide(table) {
    const column = table.parentElement.clientWidth;
    return table.scrollWidth > table.clientWidth + 1 || table.getBoundingClientRect().width > column + 1;
  }

  function layout() {
    document.querySelectorAll("main table[data-cards-ok]").forEach((table) => {
      table.classList.remove(CARDS);
      if (tooWide(table)) table.classList.add(CARDS);
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    document.querySelectorAll("main table").forEach((table) => {
      if (label(table)) table.setAttribute("data-cards-ok", "");
    });
    layout();
    let pending = null;
    window.addEventListener("resize", () => { clearTimeout(pending); pending = setTimeout(layout, 100); });
  });
  window.addEventListener("load", layout);  // again once fonts, images and equations have their sizes
})();
