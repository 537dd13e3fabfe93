//! The `leasehold` binary's tests: real processes, real files.

mod cli;
