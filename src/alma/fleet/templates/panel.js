(function () {
  "use strict";
  // Staleness is decided here, from the data time embedded at render, so a page served or
  // cached long after rendering still warns. A missing or bad timestamp counts as stale.
  var body = document.body;
  var dataEpoch = Number(body.getAttribute("data-data-epoch"));
  var staleAfter = Number(body.getAttribute("data-stale-after"));
  var banner = document.getElementById("stale-banner");
  var ageEl = document.getElementById("data-age");
  function words(s) {
    if (s < 120) return Math.round(s) + " s";
    if (s < 7200) return Math.round(s / 60) + " min";
    if (s < 172800) return Math.round(s / 3600) + " h";
    return Math.round(s / 86400) + " days";
  }
  function check() {
    var age = Date.now() / 1000 - dataEpoch;
    var stale = !(age <= staleAfter);
    banner.hidden = !stale;
    body.classList.toggle("is-stale", stale);
    body.classList.toggle("is-fresh", !stale);
    ageEl.textContent = isFinite(age) ? (age < 0 ? "from the future: clocks disagree" : words(age) + " old") : "age unknown";
  }
  check();
  setInterval(check, 15000);
})();
