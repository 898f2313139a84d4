// Web Worker: loads the wasm package and runs the training loop off the page's thread.
// Messages in: {cmd: "init", url, autostart, resumeToken, compression, joinToken, cpu} |
// {cmd: "start"} | {cmd: "stop"} | {cmd: "cpu", percent}.
// Messages out: the BrowserWorker's events ({state, round, gradients, loss, ...}).

import init, { BrowserWorker } from "./pkg/worker_wasm.js";

postMessage({ state: "loading" });
const ready = init().catch((err) => {
  postMessage({ state: "error", message: `could not load the wasm worker: ${err}` });
  throw err;
});
let worker = null;

onmessage = async ({ data: msg }) => {
  await ready;
  switch (msg.cmd) {
    case "init":
      worker = new BrowserWorker(
        msg.url,
        (event) => postMessage(event),
        msg.resumeToken ?? undefined,
        msg.compression ?? undefined,
        msg.joinToken ?? undefined,
      );
      if (msg.cpu) worker.set_cpu(msg.cpu);
      if (msg.autostart) worker.start();
      else postMessage({ state: "paused" });
      break;
    case "start":
      worker?.start();
      break;
    case "stop":
      worker?.stop();
      break;
    case "cpu":
      worker?.set_cpu(msg.percent);
      break;
  }
};
