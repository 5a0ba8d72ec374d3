// Keyboard and selection helpers for the review pages. No inline scripts: the pages run
// under a Content-Security-Policy that allows only the app's own script files.
(function () {
  "use strict";

  function typing(event) {
    var el = event.target;
    var tag = el && el.tagName;
    return tag === "INPUT" || tag === "TEXTAREA" || tag === "SELECT" || (el && el.isContentEditable);
  }

  function go(id) {
    var link = document.getElementById(id);
    if (link) window.location.href = link.href;
  }

  // Characters (code points, as the server counts them) in a range's text.
  function codePoints(text) {
    return Array.from(text).length;
  }

  // The selection inside one message's text, as {pos, quote, start, end}, or null.
  function selectedQuote() {
    var sel = window.getSelection();
    if (!sel || sel.rangeCount === 0 || sel.isCollapsed) return null;
    var range = sel.getRangeAt(0);
    var node = range.commonAncestorContainer;
    var box = node.nodeType === 1 ? node : node.parentElement;
    var textEl = box && box.closest(".msg-text[data-pos]");
    if (!textEl) return null;
    var before = document.createRange();
    before.selectNodeContents(textEl);
    before.setEnd(range.startContainer, range.startOffset);
    var quote = range.toString();
    var start = codePoints(before.toString());
    return { pos: textEl.dataset.pos, quote: quote, start: start, end: start + codePoints(quote) };
  }

  var lastQuote = null;
  document.addEventListener("selectionchange", function () {
    var q = selectedQuote();
    if (q) lastQuote = q;
  });

  function focusedMessage() {
    var active = document.activeElement && document.activeElement.closest && document.activeElement.closest(".msg");
    if (active) return active;
    var hash = window.location.hash && document.querySelector(window.location.hash + ".msg");
    if (hash) return hash;
    var assistants = document.querySelectorAll(".msg-assistant");
    return assistants.length ? assistants[assistants.length - 1] : document.querySelector(".msg");
  }

  function openComment(msg, quote) {
    var details = msg && msg.querySelector("details.comment-new");
    if (!details) return;
    details.open = true;
    var form = details.querySelector("form");
    var preview = form.querySelector(".quote-preview");
    if (quote) {
      form.elements.quote.value = quote.quote;
      form.elements.quote_start.value = quote.start;
      form.elements.quote_end.value = quote.end;
      preview.textContent = quote.quote;
      preview.hidden = false;
    }
    form.elements.body.focus();
  }

  // Trace list: j/k move the highlighted row, Enter opens it, "/" searches.
  function listKeys(event) {
    var rows = Array.prototype.slice.call(document.querySelectorAll("tr.trace-row"));
    if (event.key === "/") {
      var q = document.getElementById("id_q");
      if (q) { event.preventDefault(); q.focus(); }
      return;
    }
    if (!rows.length) return;
    var at = rows.findIndex(function (r) { return r.classList.contains("current"); });
    if (event.key === "j" || event.key === "k") {
      var next = event.key === "j" ? Math.min(at + 1, rows.length - 1) : Math.max(at - 1, 0);
      if (at >= 0) rows[at].classList.remove("current");
      rows[next].classList.add("current");
      rows[next].scrollIntoView({ block: "nearest" });
    } else if ((event.key === "Enter" || event.key === "o") && at >= 0) {
      window.location.href = rows[at].dataset.href;
    }
  }

  function detailKeys(event) {
    if (event.key === "j") go("next-trace");
    else if (event.key === "k") go("prev-trace");
    else if (event.key === "c") {
      event.preventDefault();
      var quote = selectedQuote() || lastQuote;
      var msg = quote ? document.getElementById("msg-" + quote.pos) : focusedMessage();
      openComment(msg, quote);
    } else if (event.key === "d") {
      var done = document.getElementById("queue-done");
      if (done) done.requestSubmit();
    } else if (event.key === "s") {
      var skip = document.getElementById("queue-skip");
      if (skip) skip.requestSubmit();
    }
  }

  document.addEventListener("keydown", function (event) {
    if (event.defaultPrevented || event.ctrlKey || event.metaKey || event.altKey || typing(event)) return;
    if (document.querySelector(".conversation")) detailKeys(event);
    else if (document.getElementById("trace-rows")) listKeys(event);
  });

  // Opening a comment box by its summary uses the current selection too.
  document.addEventListener("toggle", function (event) {
    var details = event.target;
    if (!(details.classList && details.classList.contains("comment-new")) || !details.open) return;
    var msg = details.closest(".msg");
    if (lastQuote && msg && msg.id === "msg-" + lastQuote.pos && !details.querySelector("form").elements.quote.value) {
      openComment(msg, lastQuote);
    }
  }, true);

  // Clicking a list row opens the trace.
  document.addEventListener("click", function (event) {
    var row = event.target.closest && event.target.closest("tr.trace-row");
    if (row && !event.target.closest("a")) window.location.href = row.dataset.href;
  });

  // Correction editor: add and remove tool-call rows.
  document.addEventListener("click", function (event) {
    if (event.target.id === "add-tool-row") {
      var template = document.getElementById("tool-row-template");
      document.getElementById("tool-rows").appendChild(template.content.cloneNode(true));
    } else if (event.target.classList && event.target.classList.contains("remove-tool-row")) {
      event.target.closest(".tool-row").remove();
    }
  });
})();
