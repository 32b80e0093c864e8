// Follows a running summary through its server-sent events (the session's WatchSession stream,
// relayed by the console), then reloads the page to show the result.
(function () {
  "use strict";
  var box = document.getElementById("progress");
  if (!box || !window.EventSource) { return; }
  var source = new EventSource(box.getAttribute("data-events"));
  var bar = document.getElementById("bar");
  source.onmessage = function (message) {
    var e = JSON.parse(message.data);
    document.getElementById("stage").textContent = e.stage;
    document.getElementById("rounds").textContent = e.round + (e.total_rounds ? " of " + e.total_rounds : "");
    document.getElementById("accessed").textContent = e.points_accessed;
    if (e.message) { document.getElementById("message").textContent = e.message; }
    if (e.total_rounds) { bar.max = e.total_rounds; bar.value = e.round; }
  };
  source.addEventListener("end", function (message) {
    source.close();
    var end = JSON.parse(message.data);
    if (end.error) { document.getElementById("message").textContent = end.error; }
    window.location.reload();
  });
})();

// The request form: each method's state for the "Fewest owners" chosen (the page holds every
// choice's, data-runs-N and data-label-N for N = 0 .. owners + 1, the last for any larger value).
(function () {
  "use strict";
  var form = document.getElementById("request-form");
  if (!form) { return; }
  var field = form.querySelector("input[name=min_owners]");
  var select = form.querySelector("select[name=method]");
  var top = parseInt(form.getAttribute("data-owners"), 10) + 1;
  function show() {
    var chosen = parseInt(field.value, 10);
    var level = isNaN(chosen) || chosen < 0 ? 0 : Math.min(chosen, top);
    Array.prototype.forEach.call(select.options, function (option) {
      option.disabled = option.getAttribute("data-runs-" + level) !== "1";
      option.textContent = option.getAttribute("data-label-" + level);
      var item = form.querySelector("#method-terms li[data-method='" + option.value + "']");
      if (item) { item.className = option.disabled ? "refused" : "served"; }
    });
    var selected = select.options[select.selectedIndex];
    if (selected && selected.disabled) {
      var first = Array.prototype.find.call(select.options, function (o) { return !o.disabled; });
      if (first) { select.value = first.value; }
    }
    Array.prototype.forEach.call(form.querySelectorAll("#method-terms [data-min]"), function (note) {
      note.hidden = note.getAttribute("data-min") !== String(level);
    });
  }
  field.addEventListener("input", show);
  show();
})();

// A form's error, shown again with what was entered: brought into sight and focused; after a
// POST, the address becomes the form's own (data-address), so that a reload does not send the
// form again.
(function () {
  "use strict";
  var error = document.querySelector("[data-in-sight]");
  if (!error) { return; }
  var address = error.getAttribute("data-address");
  if (address && window.history && window.history.replaceState) {
    window.history.replaceState(null, "", address);
  }
  error.scrollIntoView({block: "center"});
  error.focus({preventScroll: true});
})();
