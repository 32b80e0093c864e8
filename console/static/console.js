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
