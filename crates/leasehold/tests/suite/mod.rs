mod elector_time;
mod etcd;
mod memory;
mod sqlite;
