// dpfusion console: the live preview of the Ask page. As the analyst types (or changes a control), the form is sent
// to /ask/preview (EXPLAIN DP: nothing read, nothing spent) at most once per pause, and the answer, HTML rendered
// and escaped by the server, replaces the preview. Nothing else runs in the page.
"use strict";
document.addEventListener("DOMContentLoaded", function () {
  var form = document.getElementById("ask");
  var preview = document.getElementById("preview");
  if (!form || !preview) return;
  var timer = null;
  var sent = 0;
  function refresh() {
    var mine = ++sent;
    var body = new URLSearchParams(new FormData(form));
    fetch("/ask/preview", {
      method: "POST",
      body: body,
      credentials: "same-origin",
      headers: { "Content-Type": "application/x-www-form-urlencoded" },
    })
      .then(function (r) {
        if (r.redirected) { location.href = r.url; return ""; } // the session ended: to the login page
        return r.text();
      })
      .then(function (html) {
        if (mine !== sent) return; // an older answer: a newer request is under way
        preview.innerHTML = html;
        preview.setAttribute("data-ready", String(mine));
      })
      .catch(function () { preview.textContent = "The preview is unavailable (connection lost?)."; });
  }
  form.addEventListener("input", function () {
    if (timer) clearTimeout(timer);
    timer = setTimeout(refresh, 400);
  });
});
