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

  // The turn the keys act on: the one marked current, else the focused one, the #msg-N of
  // the address, or the last assistant turn (usually the answer being reviewed).
  function focusedMessage() {
    var current = document.querySelector(".msg.current");
    if (current) return current;
    var active = document.activeElement && document.activeElement.closest && document.activeElement.closest(".msg");
    if (active) return active;
    var hash = window.location.hash && /^#msg-\d+$/.test(window.location.hash) && document.querySelector(window.location.hash + ".msg");
    if (hash) return hash;
    var assistants = document.querySelectorAll(".msg-assistant");
    return assistants.length ? assistants[assistants.length - 1] : document.querySelector(".msg");
  }

  function markCurrent(msg) {
    if (!msg) return;
    document.querySelectorAll(".msg.current").forEach(function (m) { m.classList.remove("current"); });
    msg.classList.add("current");
  }

  // n/p: the next/previous assistant turn (the turns that are rated, corrected, judged).
  function moveTurn(step) {
    var turns = Array.prototype.slice.call(document.querySelectorAll(".msg-assistant"));
    if (!turns.length) return;
    var at = turns.indexOf(focusedMessage());
    var next = at < 0 ? (step > 0 ? 0 : turns.length - 1) : Math.min(Math.max(at + step, 0), turns.length - 1);
    markCurrent(turns[next]);
    turns[next].scrollIntoView({ block: "nearest" });
  }

  // +/- thumbs and 1-5 scores on the current turn: the same buttons a click presses.
  function rate(value) {
    var msg = focusedMessage();
    var button = msg && msg.querySelector('.rating form:not([inert]) button[name=rating][value="' + value + '"]');
    if (button && !button.disabled) button.click();
  }

  // Press a link, or submit a form, by id.
  function activate(id) {
    var el = document.getElementById(id);
    if (!el) return false;
    if (el.tagName === "FORM") {
      var button = el.querySelector("button[type=submit]");
      if (button && button.disabled) return false;
      el.requestSubmit();
    } else if (el.tagName === "BUTTON") {
      if (el.disabled) return false;
      el.click();
    } else if (el.href) {
      window.location.href = el.href;
    }
    return true;
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
    var inQueue = !!document.getElementById("queue-bar");
    if (event.key === "j") { if (inQueue) activate("next-item"); else go("next-trace"); }
    else if (event.key === "k") { if (inQueue) activate("prev-item"); else go("prev-trace"); }
    else if (event.key === "n") moveTurn(1);
    else if (event.key === "p") moveTurn(-1);
    else if (event.key === "c") {
      event.preventDefault();
      var quote = selectedQuote() || lastQuote;
      var msg = quote ? document.getElementById("msg-" + quote.pos) : focusedMessage();
      markCurrent(msg);
      openComment(msg, quote);
    } else if (event.key === "+" || event.key === "=") rate("up");
    else if (event.key === "-") rate("down");
    else if (/^[1-5]$/.test(event.key)) rate(event.key);
    else if (event.key === "d") activate("queue-done");
    else if (event.key === "s") activate("queue-skip");
  }

  // Keys pressed while an htmx request or swap is under way wait for it to settle: a fast
  // reviewer's "-" then "3" must not press a button htmx has not taken over yet (the browser
  // would post it as a plain form and reload the page).
  var inflight = 0;
  var settling = false;
  var settleTimer = null;
  var waiting = [];
  function idle() { return inflight === 0 && !settling; }
  function flush() {
    while (idle() && waiting.length) detailKeys(waiting.shift());
  }
  document.addEventListener("htmx:beforeRequest", function () { inflight += 1; });
  document.addEventListener("htmx:afterRequest", function () {
    inflight = Math.max(0, inflight - 1);
    // A swap settles (and htmx takes over the new content) shortly after; a response that
    // swaps nothing never settles, so a short timer stands in for it.
    settling = true;
    window.clearTimeout(settleTimer);
    settleTimer = window.setTimeout(function () { settling = false; flush(); }, 80);
  });
  document.addEventListener("htmx:afterSettle", function () {
    settling = false;
    window.clearTimeout(settleTimer);
    flush();
  });
  function detailKeysWhenIdle(event) {
    if (idle()) { detailKeys(event); return; }
    event.preventDefault();
    waiting.push({ key: event.key, preventDefault: function () {} });
  }

  function queueKeys(event) {
    if (event.key === "j") activate("queue-next");
  }

  document.addEventListener("keydown", function (event) {
    // Ctrl/Cmd+Enter sends the form being typed in (a comment, a correction); Escape leaves it.
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey) && typing(event)) {
      var form = event.target.form;
      if (form) { event.preventDefault(); form.requestSubmit(); }
      return;
    }
    if (event.key === "Escape" && typing(event)) {
      var details = event.target.closest("details.comment-new");
      if (details) details.open = false;
      event.target.blur();
      return;
    }
    if (event.defaultPrevented || event.ctrlKey || event.metaKey || event.altKey || typing(event)) return;
    if (document.querySelector(".conversation")) detailKeysWhenIdle(event);
    else if (document.getElementById("trace-rows")) listKeys(event);
    else if (document.getElementById("queue-items")) queueKeys(event);
  });

  // Clicking in an assistant turn makes it the one the keys act on.
  document.addEventListener("click", function (event) {
    var msg = event.target.closest && event.target.closest(".msg-assistant");
    if (msg) markCurrent(msg);
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

  // The filter form shows what the address says: after back/forward (htmx restores the list
  // from its history, or the browser from its cache) the fields follow the URL.
  function syncFilters() {
    var form = document.getElementById("filters");
    if (!form) return;
    var params = new URLSearchParams(window.location.search);
    Array.prototype.forEach.call(form.elements, function (el) {
      if (!el.name || el.type === "hidden" || el.type === "submit") return;
      var value = params.get(el.name);
      if (el.type === "checkbox") el.checked = value !== null;
      else el.value = value === null ? "" : value;
    });
  }
  document.addEventListener("htmx:historyRestore", syncFilters);
  window.addEventListener("pageshow", syncFilters);

  // Clicking a list row opens the trace.
  document.addEventListener("click", function (event) {
    var row = event.target.closest && event.target.closest("tr.trace-row");
    if (row && !event.target.closest("a")) window.location.href = row.dataset.href;
  });

  // Correction editor: add and remove tool-call rows; Cancel closes an inline editor.
  document.addEventListener("click", function (event) {
    var target = event.target;
    if (!target.classList) return;
    if (target.classList.contains("add-tool-row")) {
      var form = target.closest("form");
      var template = form.querySelector("template.tool-row-template");
      form.querySelector(".tool-rows").appendChild(template.content.cloneNode(true));
    } else if (target.classList.contains("remove-tool-row")) {
      target.closest(".tool-row").remove();
    } else if (target.classList.contains("cancel-correction")) {
      var slot = target.closest(".correction-slot");
      if (slot) slot.innerHTML = "";
    }
  });

  // After htmx puts a form back with an error, show the error: scroll it into view beside
  // its field and put the cursor in that field.
  document.addEventListener("htmx:afterSettle", function (event) {
    var target = event.detail && event.detail.elt;
    var error = target && target.querySelector && target.querySelector(".error[role=alert]");
    if (!error) return;
    error.scrollIntoView({ block: "center" });
    var field = (error.closest(".tool-row") || target).querySelector("[aria-invalid=true]");
    if (field) field.focus({ preventScroll: true });
  });
})();
