//! The gradients a session receives: checked chunk by chunk by the core's
//! [`Upload`], into the room an upload [`Slot`] gives (see
//! [`slots`]), which bounds how many gradients the coordinator receives at once.

pub mod slots;

pub use coordinator_core::upload::{Progress, Upload};
pub use slots::{Slot, UploadSlots};
