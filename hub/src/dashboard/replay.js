// A recorded shell session replayed: the asciicast v2 file from the API, its output written
// into a terminal at the pace it came (idle gaps shortened to 2 s), its resizes applied.
"use strict";

(() => {
  const holder = document.getElementById("replay");
  if (!holder) return;
  const status = (text) => { document.getElementById("replay-status").textContent = text; };
  const play = document.getElementById("play");
  const pause = document.getElementById("pause");
  const speed = document.getElementById("speed");
  const terminal = new Terminal({ fontFamily: "monospace", fontSize: 14, disableStdin: true, convertEol: false, theme: { background: "#101722", foreground: "#e8edf4" } });
  terminal.open(document.getElementById("terminal"));
  let events = [];
  let at = 0;
  let timer = null;
  const MAX_GAP = 2;

  const apply = ([, code, data]) => {
    if (code === "o") terminal.write(data);
    if (code === "r") {
      const [cols, rows] = data.split("x").map(Number);
      if (cols > 0 && rows > 0) terminal.resize(cols, rows);
    }
    if (code === "m") status(data);
  };
  const stop = (text) => {
    clearTimeout(timer);
    timer = null;
    play.disabled = false;
    pause.disabled = true;
    if (text) status(text);
  };
  const step = () => {
    const rate = Number(speed.value);
    if (rate === 0) {
      while (at < events.length) apply(events[at++]);
    }
    if (at >= events.length) {
      holder.dataset.played = "true";
      stop("The session is over. Play starts it again.");
      return;
    }
    apply(events[at]);
    at += 1;
    if (at >= events.length) {
      step();
      return;
    }
    const gap = Math.min(MAX_GAP, Math.max(0, events[at][0] - events[at - 1][0]));
    timer = setTimeout(step, (gap * 1000) / rate);
  };
  play.addEventListener("click", () => {
    if (at >= events.length) {
      at = 0;
      terminal.reset();
    }
    play.disabled = true;
    pause.disabled = false;
    status("Playing.");
    step();
  });
  pause.addEventListener("click", () => stop("Paused."));

  (async () => {
    const response = await fetch(`/v1/recordings/${encodeURIComponent(holder.dataset.id)}/cast`, { cache: "no-store" });
    if (!response.ok) {
      const data = await response.json().catch(() => null);
      document.getElementById("replay-error").textContent = (data && data.message) || `The hub answered ${response.status}.`;
      return;
    }
    const lines = (await response.text()).split("\n").filter((l) => l.trim() !== "");
    const header = JSON.parse(lines[0] || "{}");
    if (header.width && header.height) terminal.resize(header.width, header.height);
    events = lines.slice(1).map((l) => JSON.parse(l));
    holder.dataset.loaded = "true";
    status(`${events.length} events, ${events.length ? events[events.length - 1][0].toFixed(1) : 0} s. Play to replay.`);
  })();
})();
