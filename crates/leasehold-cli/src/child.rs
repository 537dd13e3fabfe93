//! The command's exit status, as a shell reports it.

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

/// The conventional shell status of an exited process: its code, or 128+N
/// when signal N ended it.
pub fn exit_code(status: ExitStatus) -> u8 {
    if let Some(code) = status.code() {
        return u8::try_from(code & 0xff).unwrap_or(1);
    }
    status
        .signal()
        .and_then(|sig| u8::try_from(128 + sig).ok())
        .unwrap_or(1)
}
