// The campaign wizard's advisory search: rows whose bulletin, title or CVEs hold every word typed
// stay, the others hide; a match among the advisories with no exposed node opens their list.
(function () {
  "use strict";
  const box = document.getElementById("advisory-search");
  if (!box) return;
  const status = document.getElementById("advisory-search-status");
  const others = document.getElementById("advisories-others");
  const rows = Array.from(document.querySelectorAll("#advisory-choice tr[data-search]"));
  let openedBySearch = false;

  function filter() {
    const words = box.value.toLowerCase().split(/\s+/).filter(Boolean);
    let shown = 0, shownOthers = 0;
    for (const row of rows) {
      const keep = row.querySelector("input:checked") !== null ||
        words.every((w) => row.dataset.search.includes(w));
      row.hidden = !keep;
      if (keep) {
        shown += 1;
        if (others && others.contains(row)) shownOthers += 1;
      }
    }
    if (others) {
      if (words.length && shownOthers && !others.open) { others.open = true; openedBySearch = true; }
      if (!words.length && openedBySearch) { others.open = false; openedBySearch = false; }
    }
    status.textContent = words.length ? `${shown} of ${rows.length} advisories match` : "";
  }

  box.addEventListener("input", filter);
  // Enter in the search box filters; it does not submit the wizard.
  box.addEventListener("keydown", (event) => { if (event.key === "Enter") event.preventDefault(); });
})();
