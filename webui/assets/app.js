// taskrun web interface: live updates over server-sent events. Pages work
// without this script; it only adds live output and a live run list. Every
// piece of run data is inserted as text (textContent), never as markup,
// except the run list's rows, which the server rendered and escaped.
"use strict";

(function () {
  function followOutput(pre) {
    var url = pre.getAttribute("data-follow");
    var note = document.getElementById("output-note");
    var es = new EventSource(url);
    es.addEventListener("out", function (ev) {
      var msg = JSON.parse(ev.data);
      pre.appendChild(document.createTextNode(msg.d));
      pre.scrollTop = pre.scrollHeight;
    });
    es.addEventListener("end", function () {
      es.close();
      if (note) {
        note.textContent = "The run's output ended. Reload the page for its stored records.";
      }
      pre.setAttribute("data-ended", "true");
    });
    es.addEventListener("cut", function () {
      es.close();
      if (note) {
        note.textContent = "Live output stopped here: the output is large. Download the log once the run ends.";
      }
    });
    es.addEventListener("failed", function (ev) {
      es.close();
      if (note) {
        note.textContent = "Live output failed: " + JSON.parse(ev.data);
      }
    });
  }

  function liveRuns(table) {
    var url = table.getAttribute("data-live");
    var tbody = table.tBodies[0];
    var es = new EventSource(url);
    var note = document.getElementById("live-note");
    if (note) {
      note.hidden = false;
    }
    es.addEventListener("rows", function (ev) {
      var html = JSON.parse(ev.data);
      var doc = new DOMParser().parseFromString(
        "<table><tbody>" + html + "</tbody></table>", "text/html");
      var rows = doc.querySelector("tbody");
      if (!rows) {
        return;
      }
      var fresh = document.createElement("tbody");
      while (rows.firstChild) {
        fresh.appendChild(document.adoptNode(rows.firstChild));
      }
      table.replaceChild(fresh, tbody);
      tbody = fresh;
    });
  }

  document.addEventListener("DOMContentLoaded", function () {
    var pre = document.querySelector("pre[data-follow]");
    if (pre) {
      followOutput(pre);
    }
    var table = document.querySelector("table[data-live]");
    if (table) {
      liveRuns(table);
    }
  });
})();
