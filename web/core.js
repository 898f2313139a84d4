// A helper Web Worker: one more core for this tab. The training Web Worker (worker.js)
// posts it parts of batches; it computes each with its own instance of the wasm module
// and posts back the part's loss and gradient (its buffer transferred, not copied).
// Messages in: {id, spec, weights, x, labels, seed, start, end, batch}.
// Messages out: {id, loss, grads} | {id, error} | {ready: true} | {failed: message}.

import { loadWasm } from "./wasm.js";

let PartWorker = null;
let part = null;
// The build the training Web Worker loaded: the same query (?relaxed=0) decides.
const ready = loadWasm(self.location.search)
  .then(({ wasm }) => {
    PartWorker = wasm.PartWorker;
    postMessage({ ready: true });
  })
  .catch((err) => postMessage({ failed: String(err) }));

onmessage = async ({ data: m }) => {
  await ready;
  try {
    if (!PartWorker) throw new Error("the wasm module did not load");
    if (!part || part.spec() !== m.spec) {
      part?.free();
      part = new PartWorker(m.spec);
    }
    const loss = part.compute(m.weights, m.x, m.labels, m.seed, m.start, m.end, m.batch);
    const grads = part.gradient();
    postMessage({ id: m.id, loss, grads }, [grads.buffer]);
  } catch (err) {
    postMessage({ id: m.id, error: String(err) });
  }
};
