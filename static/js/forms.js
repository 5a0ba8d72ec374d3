// Every page: a form that comes back with an error shows it where the reader is. The error
// summary (at the top of the form, each entry a link to its field) is scrolled into view and
// the cursor put in the first field in error; a link of the summary moves the cursor to its
// field. A page with a single error beside its field scrolls to that error.
(function () {
  "use strict";

  function focusField(field) {
    field.scrollIntoView({ block: "center" });
    field.focus({ preventScroll: true });
  }

  document.addEventListener("click", function (event) {
    var link = event.target.closest && event.target.closest(".error-summary a[href^='#']");
    if (!link) return;
    var field = document.getElementById(link.getAttribute("href").slice(1));
    if (!field) return;
    event.preventDefault();
    focusField(field);
  });

  document.addEventListener("DOMContentLoaded", function () {
    var summary = document.querySelector("main .error-summary");
    var error = summary || document.querySelector("main .error[role=alert]");
    if (!error) return;
    var scope = (summary && summary.closest("form")) || (summary && summary.parentElement) || document;
    var field = scope.querySelector("[aria-invalid=true]") || document.querySelector("main [aria-invalid=true]");
    error.scrollIntoView({ block: summary ? "start" : "center" });
    // The field's own scroll, if it is below the fold, keeps it in view; the summary stays above it.
    if (field) field.focus({ preventScroll: !!field.getBoundingClientRect && isInView(field) });
  });

  function isInView(element) {
    var r = element.getBoundingClientRect();
    return r.top >= 0 && r.bottom <= window.innerHeight;
  }
})();
