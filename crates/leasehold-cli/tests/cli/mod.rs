mod campaign;
mod harness;
mod multi_process;
mod run;
