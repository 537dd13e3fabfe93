//! How a store lays out its elections: its own layout, or another
//! election recipe's (`?layout=` of an etcd or ZooKeeper URL).

/// How a store lays out its elections: leasehold's own layout, or the
/// wire layout of another election recipe, so that its clients and
/// leasehold's take part in the same elections (`?layout=` of an etcd or
/// ZooKeeper URL).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Layout {
    /// leasehold's own keys or nodes under its prefix or root, with its
    /// marker (the default).
    #[default]
    Leasehold,
    /// etcd's `concurrency.Election` (Go clients, `etcdctl elect`).
    Concurrency,
    /// Apache Curator's `LeaderLatch` (ZooKeeper).
    Curator,
    /// kazoo's `Election` (ZooKeeper).
    Kazoo,
}

impl Layout {
    /// The `?layout=` value.
    pub fn as_str(self) -> &'static str {
        match self {
            Layout::Leasehold => "leasehold",
            Layout::Concurrency => "concurrency",
            Layout::Curator => "curator",
            Layout::Kazoo => "kazoo",
        }
    }

    /// Whether this is another recipe's layout (no notes: the recipe's
    /// own order is the only line).
    pub fn is_foreign(self) -> bool {
        self != Layout::Leasehold
    }
}
