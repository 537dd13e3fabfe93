mod elector_time;
mod etcd;
mod etcd_api;
mod fence;
mod memory;
mod postgres;
mod sqlite;
mod zookeeper;
