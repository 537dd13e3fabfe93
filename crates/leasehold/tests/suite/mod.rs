mod elector_time;
mod etcd;
mod fence;
mod memory;
mod sqlite;
