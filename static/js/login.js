// A deep link's #fragment (e.g. /traces/5/#msg-4) never reaches the server: the browser keeps
// it on the login page's address, and this carries it into `next`, so logging in lands on the
// turn the link pointed at.
(function () {
  "use strict";
  document.addEventListener("submit", function (event) {
    var next = event.target.elements && event.target.elements.next;
    var hash = window.location.hash;
    if (next && next.value && hash && /^#[\w-]+$/.test(hash) && next.value.indexOf("#") < 0) {
      next.value += hash;
    }
  });
})();
