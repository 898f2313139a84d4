// Which build of the wasm worker this browser loads, for the training Web Worker
// (worker.js) and its helpers (core.js) alike, so that every core of a tab computes in one
// float order.
//
// Two builds are served: web/pkg-relaxed/ with relaxed SIMD, whose multiply-adds
// (`f32x4.relaxed_madd`) fuse on a CPU with FMA (Chrome 114+, Firefox 145+), and web/pkg/
// without it, for a browser that cannot validate relaxed instructions (Safari) or a page
// opened with ?relaxed=0. The wasm side finds out whether its multiply-adds fuse and says
// so in its Hello, so the coordinator replays its work in that order.

// A module of one function, `(v128, v128, v128) -> v128`, that is `f32x4.relaxed_madd`:
// it validates exactly where the browser has relaxed SIMD.
const RELAXED_PROBE = new Uint8Array([
  0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00, // magic, version 1
  0x01, 0x08, 0x01, 0x60, 0x03, 0x7b, 0x7b, 0x7b, 0x01, 0x7b, // type: (v128 ×3) -> v128
  0x03, 0x02, 0x01, 0x00, // one function of that type
  0x0a, 0x0d, 0x01, 0x0b, 0x00, 0x20, 0x00, 0x20, 0x01, 0x20, 0x02, // local.get 0, 1, 2
  0xfd, 0x85, 0x02, 0x0b, // f32x4.relaxed_madd, end
]);

/// Whether this browser takes the relaxed build: it validates relaxed SIMD and `search`
/// (the page's query, passed on to the Web Workers) does not say relaxed=0.
export function wantsRelaxed(search) {
  if (new URLSearchParams(search).get("relaxed") === "0") return false;
  try {
    return WebAssembly.validate(RELAXED_PROBE);
  } catch {
    return false;
  }
}

/// The wasm package's module, initialised: the relaxed build where this browser takes it
/// and the coordinator serves it, else the plain one. `{ wasm, relaxed }`.
export async function loadWasm(search) {
  if (wantsRelaxed(search)) {
    try {
      const wasm = await import("./pkg-relaxed/worker_wasm.js");
      await wasm.default();
      return { wasm, relaxed: true };
    } catch (err) {
      // Not built on this coordinator (it serves the plain build alone): the plain one,
      // said in the console, so that a relaxed build that fails to load is not silent.
      console.warn(`the relaxed-SIMD build did not load (${err}); loading the plain one`);
    }
  }
  const wasm = await import("./pkg/worker_wasm.js");
  await wasm.default();
  return { wasm, relaxed: false };
}
