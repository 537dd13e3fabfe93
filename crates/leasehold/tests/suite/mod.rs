mod elector_time;
mod etcd;
mod examples;
mod fence;
mod memory;
mod postgres;
mod sqlite;
mod zookeeper;
