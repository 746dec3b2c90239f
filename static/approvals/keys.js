// Reviewer console keyboard and htmx glue. No globals.
//   inbox:  j / k move the selection, Enter opens the selected request, / focuses search
//   detail: a approves, r focuses the rejection reason, e opens the edit-and-approve form
// Keys are ignored while typing in a field or with a modifier held.
(function () {
  "use strict";

  function typing(evt) {
    var t = evt.target;
    if (!t || !t.tagName) return false;
    var tag = t.tagName.toLowerCase();
    return tag === "input" || tag === "textarea" || tag === "select" || t.isContentEditable;
  }

  function rows() {
    var body = document.getElementById("inbox-rows");
    return body ? Array.prototype.slice.call(body.querySelectorAll("tr.inbox-row")) : [];
  }

  function selectedIndex(list) {
    for (var i = 0; i < list.length; i++) if (list[i].classList.contains("is-selected")) return i;
    return -1;
  }

  function select(list, index) {
    if (!list.length) return;
    index = Math.max(0, Math.min(list.length - 1, index));
    list.forEach(function (row) { row.classList.remove("is-selected"); });
    var row = list[index];
    row.classList.add("is-selected");
    var link = row.querySelector(".inbox-row__link");
    if (link) link.focus();
    row.scrollIntoView({ block: "nearest" });
  }

  document.addEventListener("keydown", function (evt) {
    if (evt.ctrlKey || evt.metaKey || evt.altKey || evt.defaultPrevented || typing(evt)) return;
    var list;
    switch (evt.key) {
      case "/": {
        var search = document.getElementById("id_q");
        if (search) { evt.preventDefault(); search.focus(); search.select(); }
        return;
      }
      case "j":
      case "k":
        list = rows();
        if (!list.length) return;
        evt.preventDefault();
        var at = selectedIndex(list);
        select(list, at < 0 ? 0 : at + (evt.key === "j" ? 1 : -1));
        return;
      case "Enter": {
        var active = document.activeElement;
        if (active && active.closest && active.closest("a, button, input, textarea, select, summary")) return;
        list = rows();
        var i = selectedIndex(list);
        if (i >= 0 && list[i].dataset.href) { evt.preventDefault(); window.location.assign(list[i].dataset.href); }
        return;
      }
      case "a": {
        var approve = document.getElementById("approve-button");
        if (approve && !approve.disabled) { evt.preventDefault(); approve.click(); }
        return;
      }
      case "r": {
        var reason = document.getElementById("reject-reason");
        if (reason) { evt.preventDefault(); reason.focus(); }
        return;
      }
      case "e": {
        var edit = document.getElementById("edit-link");
        if (edit) { evt.preventDefault(); window.location.assign(edit.href); }
        return;
      }
    }
  });

  // Clicking a row (outside its links) selects it, so j/k continue from there.
  document.addEventListener("click", function (evt) {
    var row = evt.target.closest && evt.target.closest("tr.inbox-row");
    if (!row || evt.target.closest("a, button")) return;
    var list = rows();
    select(list, list.indexOf(row));
  });

  // Decisions answer 400/403/409 with the form and its message; htmx swaps only 2xx by
  // default, so opt in for the review panel.
  document.addEventListener("htmx:beforeSwap", function (evt) {
    var elt = evt.detail.requestConfig && evt.detail.requestConfig.elt;
    var status = evt.detail.xhr && evt.detail.xhr.status;
    if (elt && elt.closest && elt.closest("[data-swap-errors]") && [400, 403, 409].indexOf(status) >= 0) {
      evt.detail.shouldSwap = true;
      evt.detail.isError = false;
    }
  });

  // After a refused decision, put the focus on the field that needs attention.
  document.addEventListener("htmx:afterSwap", function (evt) {
    var review = document.getElementById("review");
    if (!review || !evt.detail.target || evt.detail.target.id !== "review") return;
    var invalid = review.querySelector('[aria-invalid="true"]');
    if (invalid) invalid.focus();
  });

  // A live insertion of a row the page already shows (a reconnect's catch-up, a second
  // approval of an L4 request) replaces it rather than duplicating it.
  document.addEventListener("htmx:oobBeforeSwap", function (evt) {
    var target = evt.detail.target;
    if (!target || target.id !== "inbox-rows" || !evt.detail.fragment) return;
    var incoming = evt.detail.fragment.querySelectorAll("tr[id]");
    for (var i = 0; i < incoming.length; i++) {
      var existing = document.getElementById(incoming[i].id);
      if (existing) existing.remove();
    }
    var empty = document.getElementById("inbox-empty");
    if (empty) empty.remove();
  });
})();
