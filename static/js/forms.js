// Every page: a form that comes back with an error shows it. The error (beside its field)
// is scrolled into view and the cursor put in that field, so it never lands below the fold.
(function () {
  "use strict";
  document.addEventListener("DOMContentLoaded", function () {
    var error = document.querySelector("main .error[role=alert]");
    if (!error) return;
    error.scrollIntoView({ block: "center" });
    var field = document.querySelector("main [aria-invalid=true]");
    if (field) field.focus({ preventScroll: true });
  });
})();
