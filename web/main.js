// The volunteer page: starts the training Web Worker and shows what it and the swarm do.
// Training runs in worker.js, so this page stays responsive.

const $ = (id) => document.getElementById(id);
const params = new URLSearchParams(location.search);
const autostart = params.get("autostart") !== "0";
// Wire format: int8 by default (a quarter of the bytes, < 0.1 accuracy points here);
// ?compression=none for exact f32, ?compression=f16 for half.
const compression = params.get("compression") ?? "int8";
// An invitation link carries the run's join token in the fragment (#token=SECRET), which
// browsers never send to the server in a request.
const joinToken = new URLSearchParams(location.hash.slice(1)).get("token");
// Same origin as the page: wss behind https, ws otherwise.
const wsUrl = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/ws`;

const LABELS = {
  starting: "starting…",
  loading: "loading the worker…",
  connecting: "connecting…",
  connected: "connected, waiting for the next round",
  training: "training",
  disconnected: "coordinator unreachable, retrying",
  paused: "paused",
  error: "error",
};

// The worker's identity survives a reload of this tab (not a new tab: sessionStorage).
const TOKEN_KEY = "crowdtrain.resumeToken";
let running = false;
const worker = new Worker(new URL("./worker.js", import.meta.url), { type: "module" });

worker.onmessage = ({ data: e }) => {
  if (e.resumeToken) sessionStorage.setItem(TOKEN_KEY, e.resumeToken);
  const state = $("state");
  state.dataset.state = e.state;
  state.textContent = LABELS[e.state] ?? e.state;
  running = !["paused", "error"].includes(e.state);
  const toggle = $("toggle");
  toggle.disabled = e.state === "error" || e.state === "loading";
  toggle.textContent = running ? "Pause" : "Resume";
  if (e.round != null) $("round").textContent = e.round;
  if (e.gradients != null) $("gradients").textContent = e.gradients;
  if (e.loss != null) $("loss").textContent = e.loss.toFixed(4);
  if (e.samplesPerSec) $("rate").textContent = Math.round(e.samplesPerSec).toLocaleString();
  if (e.workerId != null) $("worker-id").textContent = e.workerId;
  if (e.state === "disconnected") {
    $("message").textContent = `${e.message ?? "disconnected"}; retrying in ${(e.retryInMs / 1000).toFixed(1)} s`;
  } else if (e.message) {
    $("message").textContent = e.message;
  } else if (e.state === "training") {
    $("message").textContent = "";
  }
};
worker.onerror = (e) => {
  $("state").dataset.state = "error";
  $("state").textContent = "error";
  $("message").textContent = `the worker failed to start: ${e.message ?? e}`;
};

$("toggle").onclick = () => worker.postMessage({ cmd: running ? "stop" : "start" });
worker.postMessage({
  cmd: "init",
  url: wsUrl,
  autostart,
  compression,
  resumeToken: sessionStorage.getItem(TOKEN_KEY),
  joinToken,
});

async function pollSwarm() {
  try {
    const res = await fetch("/api/status", { cache: "no-store" });
    const s = await res.json();
    $("accuracy").textContent = s.test_accuracy == null ? "not evaluated yet" : `${(s.test_accuracy * 100).toFixed(1)} %`;
    $("workers").textContent = s.workers;
    $("swarm-round").textContent = s.round;
  } catch {
    $("accuracy").textContent = "coordinator unreachable";
  }
}
pollSwarm();
setInterval(pollSwarm, 2000);
