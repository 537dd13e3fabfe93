mod elector_time;
mod etcd;
mod fence;
mod memory;
mod postgres;
mod sqlite;
mod zookeeper;
