mod elector_time;
mod memory;
mod sqlite;
