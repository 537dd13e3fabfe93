mod campaign;
mod etcd;
mod fencing;
mod harness;
mod multi_process;
mod operability;
mod run;
mod zk_postgres;
