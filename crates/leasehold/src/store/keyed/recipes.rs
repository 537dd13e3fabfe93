//! Curator's `LeaderLatch` and kazoo's `Election` (`?layout=curator|kazoo`)
//! as key layouts of the one election: a candidate is a node the store
//! names by its sequence (a put of `E/{prefix}` creates `E/{prefix}{seq}`),
//! ephemeral to its session; the recipe's order of the names is the line,
//! its first leads, and its creation revision (`czxid`) is the token.
//! Pure: the names leasehold's candidates take, and the recipes' orders.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::store::layout::Layout;

/// What Curator's `LeaderLatch` names its nodes after the protection
/// prefix, and what its sorting looks for.
const LATCH: &str = "latch-";
/// What kazoo's `Lock` names its nodes after the contender's uuid.
const LOCK: &str = "__lock__";
/// Curator's protection prefix: `_c_{uuid}-`.
const PROTECTED: &str = "_c_";

/// Whether `layout` is a recipe whose store names its candidates.
pub(crate) fn store_named(layout: Layout) -> bool {
    matches!(layout, Layout::Curator | Layout::Kazoo)
}

/// A new prefix for a candidate node's name, unique to its creator, to
/// which the store appends the sequence: Curator's protected name
/// `_c_{uuid}-latch-`, kazoo's `{uuid hex}__lock__`.
pub(crate) fn new_prefix(layout: Layout) -> String {
    let uuid = random_uuid();
    match layout {
        Layout::Kazoo => format!("{uuid:032x}{LOCK}"),
        _ => format!("{PROTECTED}{}-{LATCH}", hyphenated(uuid)),
    }
}

/// The election's contenders among the node names `names`, in the
/// recipe's order: the first leads, and each waiter watches the one just
/// ahead of it.
///
/// - Curator sorts every child (it skips none) by the text after the
///   last `latch-` in its name, or by the whole name if there is none.
/// - kazoo (2.8, as Debian ships it) counts only the children whose
///   name ends in `__lock__` and ten digits, with an optional `-` before
///   them (a wrapped sequence), and sorts them by that sequence; a
///   `__rlock__` (a read lock's) or any other node is no contender of an
///   election and never makes anyone wait. Earlier kazoo releases sort
///   by the text after `__lock__` or `__rlock__`, unknown names last,
///   and wait only on `__lock__` nodes: the same leader and the same
///   predecessors for every node either client writes.
///
/// Names the recipe sorts alike (only a name that is no recipe's can
/// tie) are put in the order of their names, where the recipes keep the
/// order the server listed them in. Returns indices into `names`.
pub(crate) fn line(layout: Layout, names: &[&str]) -> Vec<usize> {
    let mut keyed: Vec<(&str, &str, usize)> = match layout {
        Layout::Kazoo => (names.iter().enumerate())
            .filter_map(|(i, n)| Some((kazoo_key(n)?, *n, i)))
            .collect(),
        _ => (names.iter().enumerate())
            .map(|(i, n)| (curator_key(n), *n, i))
            .collect(),
    };
    keyed.sort();
    keyed.into_iter().map(|(_, _, i)| i).collect()
}

/// Curator's sorting key (`StandardLockInternalsDriver.fixForSorting`):
/// the text after the last `latch-`, or the whole name. (Java compares
/// keys by UTF-16 code units, which orders the characters ZooKeeper admits
/// in a name, none a surrogate, as Rust's comparison of `str` does.)
fn curator_key(name: &str) -> &str {
    match name.rfind(LATCH) {
        Some(at) => &name[at + LATCH.len()..],
        None => name,
    }
}

/// kazoo's sorting key for a contender of its `Lock` — the sequence at the
/// end of `…__lock__NNNNNNNNNN` (or `…__lock__-NNNNNNNNNN`) — or `None` for
/// a node that is none. (kazoo's pattern takes any Unicode decimal digit;
/// ZooKeeper writes ASCII ones, the only ones taken here.)
fn kazoo_key(name: &str) -> Option<&str> {
    let bytes = name.as_bytes();
    let digits = bytes.len().checked_sub(10)?;
    if !bytes[digits..].iter().all(u8::is_ascii_digit) {
        return None;
    }
    // `digits` is a character boundary: the byte there is an ASCII digit.
    let head = &name[..digits];
    if head.ends_with(LOCK) {
        Some(&name[digits..])
    } else if head.ends_with('-') && head[..head.len() - 1].ends_with(LOCK) {
        Some(&name[digits - 1..])
    } else {
        None
    }
}

/// 128 random bits as a version-4 UUID: from the kernel's random source,
/// else from the standard library's per-process random hash keys, the
/// clock and a counter (unique, if less random).
fn random_uuid() -> u128 {
    use std::io::Read;
    let mut bytes = [0u8; 16];
    let read = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes));
    if read.is_err() {
        use std::hash::{BuildHasher, Hasher};
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        for (i, chunk) in bytes.chunks_mut(8).enumerate() {
            let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
            hasher.write_u64(n);
            hasher.write_usize(i);
            hasher.write_u128(now);
            hasher.write_u32(std::process::id());
            chunk.copy_from_slice(&hasher.finish().to_le_bytes());
        }
    }
    // Version 4 (random), variant 10 (RFC 4122).
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    u128::from_be_bytes(bytes)
}

/// A UUID as Java's `UUID.toString` writes it: lowercase, 8-4-4-4-12.
fn hyphenated(uuid: u128) -> String {
    let hex = format!("{uuid:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| (*s).to_owned()).collect()
    }

    fn in_line(layout: Layout, children: &[String]) -> Vec<String> {
        let names: Vec<&str> = children.iter().map(String::as_str).collect();
        line(layout, &names)
            .into_iter()
            .map(|i| children[i].clone())
            .collect()
    }

    #[test]
    fn curator_sorts_by_the_text_after_the_last_latch() {
        let children = names(&[
            "_c_2b1a4c8e-0000-4000-8000-000000000002-latch-0000000007",
            "_c_9f0e5d3a-0000-4000-8000-000000000001-latch-0000000003",
            "latch-0000000005",
            // After the last `latch-`: "0000000004".
            "x-latch-9-latch-0000000004",
        ]);
        assert_eq!(
            in_line(Layout::Curator, &children),
            names(&[
                "_c_9f0e5d3a-0000-4000-8000-000000000001-latch-0000000003",
                "x-latch-9-latch-0000000004",
                "latch-0000000005",
                "_c_2b1a4c8e-0000-4000-8000-000000000002-latch-0000000007",
            ])
        );
    }

    #[test]
    fn curator_counts_a_node_without_latch_by_its_whole_name() {
        // Curator skips no child: one without `latch-` sorts by its whole
        // name, here after the sequences ("l" > "9")…
        let children = names(&["lock", "_c_a-latch-0000000002", "_c_b-latch-0000000001"]);
        assert_eq!(
            in_line(Layout::Curator, &children),
            names(&["_c_b-latch-0000000001", "_c_a-latch-0000000002", "lock"])
        );
        // …and here before them ("-" < "0"), so it leads, as it does for
        // Curator's own clients.
        let children = names(&["_c_b-latch-0000000001", "0-first"]);
        assert_eq!(
            in_line(Layout::Curator, &children),
            names(&["0-first", "_c_b-latch-0000000001"])
        );
        // Equal keys: by name.
        let children = names(&["b-latch-0000000001", "0000000001", "a-latch-0000000001"]);
        assert_eq!(
            in_line(Layout::Curator, &children),
            names(&["0000000001", "a-latch-0000000001", "b-latch-0000000001"])
        );
    }

    #[test]
    fn kazoo_counts_only_lock_nodes_by_their_sequence() {
        let children = names(&[
            "d3b07384d113edec49eaa6238ad5ff00__lock__0000000009",
            "c157a79031e1c40f85931829bc5fc552__rlock__0000000001",
            "lease_holder",
            "0000000000",
            "x__lock__12345",
            "x__lock__00000000001",
            "9e107d9d372bb6826bd81d3542a419d6__lock__0000000002",
            "a__lock__-0000000005",
        ]);
        assert_eq!(
            in_line(Layout::Kazoo, &children),
            names(&[
                // A wrapped sequence sorts first ("-" < "0"), as in kazoo.
                "a__lock__-0000000005",
                "9e107d9d372bb6826bd81d3542a419d6__lock__0000000002",
                "d3b07384d113edec49eaa6238ad5ff00__lock__0000000009",
            ])
        );
        assert_eq!(kazoo_key("__lock__0000000001"), Some("0000000001"));
        assert_eq!(kazoo_key("é__lock__0000000001"), Some("0000000001"));
        assert_eq!(kazoo_key("é0000000001"), None);
        assert_eq!(kazoo_key("__lock__"), None);
        assert_eq!(kazoo_key("-0000000001"), None);
    }

    #[test]
    fn names_are_those_the_recipes_make() {
        let curator = new_prefix(Layout::Curator);
        // `_c_` + a canonical UUID (36 characters) + `-` + `latch-`.
        assert_eq!(curator.len(), 3 + 36 + 1 + LATCH.len(), "{curator}");
        assert!(curator.starts_with("_c_") && curator.ends_with("-latch-"));
        let uuid = &curator[3..39];
        let dashes: Vec<usize> = uuid.match_indices('-').map(|(i, _)| i).collect();
        assert_eq!(dashes, [8, 13, 18, 23], "{uuid}");
        assert_eq!(&uuid[14..15], "4", "version 4: {uuid}");
        assert!(
            uuid.chars()
                .all(|c| c == '-' || c.is_ascii_digit() || ('a'..='f').contains(&c))
        );
        let kazoo = new_prefix(Layout::Kazoo);
        assert_eq!(kazoo.len(), 32 + LOCK.len(), "{kazoo}");
        assert!(kazoo.ends_with(LOCK));
        assert!(
            kazoo[..32]
                .chars()
                .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c))
        );
        assert_ne!(new_prefix(Layout::Kazoo), kazoo, "a new uuid each time");
        // What the server then names the node is a contender of the recipe.
        let node = format!("{kazoo}0000000042");
        let line = in_line(Layout::Kazoo, std::slice::from_ref(&node));
        assert_eq!(line, std::slice::from_ref(&node));
        assert_eq!(curator_key(&format!("{curator}0000000042")), "0000000042");
    }
}
