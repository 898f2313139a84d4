// Web Worker: loads the wasm package and runs the training loop off the page's thread.
// Messages in: {cmd: "init", url, autostart, resumeToken, compression, joinToken, cpu} |
// {cmd: "start"} | {cmd: "stop"} | {cmd: "cpu", percent} | {cmd: "urls", urls}.
// Messages out: the BrowserWorker's events ({state, round, gradients, loss, ...}).

postMessage({ state: "loading" });
let BrowserWorker = null;
// Imported here, not at the top: a module that fails to load there gives the page only an
// error event without a reason. The coordinator says why a package file is missing.
const ready = (async () => {
  try {
    const wasm = await import("./pkg/worker_wasm.js");
    await wasm.default();
    BrowserWorker = wasm.BrowserWorker;
  } catch (err) {
    postMessage({ state: "error", message: await whyNotLoaded(err) });
    throw err;
  }
})();
let worker = null;

async function whyNotLoaded(err) {
  for (const file of ["./pkg/worker_wasm.js", "./pkg/worker_wasm_bg.wasm"]) {
    try {
      const res = await fetch(file, { method: "HEAD", cache: "no-store" });
      if (!res.ok) {
        const said = (await fetch(file, { cache: "no-store" }).then((r) => r.text())).trim();
        return `the training code is not on this coordinator (${file.slice(2)}: HTTP ${res.status}): ${said}`;
      }
    } catch {
      return "the coordinator cannot be reached to load the training code";
    }
  }
  return `could not load the wasm worker: ${err}`;
}

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
    case "urls":
      worker?.set_urls(msg.urls.join(","));
      break;
  }
};
