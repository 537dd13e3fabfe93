mod campaign;
mod etcd;
mod harness;
mod multi_process;
mod run;
