//! The runner side of the protocol: keys, signed attestations, and (later) the probe and the
//! client. Other Rust runners can use this module as a library.

pub mod keys;
