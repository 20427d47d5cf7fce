//! What the classifier knows about an exception type ([`TypeFacts`]), and the cache
//! of it keyed by the type's version tag ([`TypeCache`]).
//!
//! The binding works the facts out from the Python type (its MRO, its slots, its
//! attributes) and reads the tag; this module decides how they are packed, where
//! they are kept and when an entry still describes the type.

use std::sync::atomic::{AtomicU64, Ordering};

use super::Kinds;

/// What the classifier needs to know about an error's type.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TypeFacts {
    /// Every kind of the table an instance is an instance of.
    pub kinds: Kinds,
    /// `str()` of an instance whose `__dict__` has `_op = None` is the `str` in its
    /// `__dict__["_message"]`: a plain-dict type with TF's `OpError.__str__` and
    /// `message`, and no `_op`/`_message` on the class.
    pub dict_message: bool,
    /// `obj.original_exception` is `obj.__dict__["original_exception"]` when there:
    /// a plain-dict type without that class attribute.
    pub dict_original: bool,
}

impl TypeFacts {
    const DICT_MESSAGE: u64 = 1 << 16;
    const DICT_ORIGINAL: u64 = 1 << 17;

    /// `tag` in the high half, the facts in the low half.
    fn pack(self, tag: u32) -> u64 {
        (u64::from(tag) << 32)
            | u64::from(self.kinds.bits())
            | if self.dict_message { Self::DICT_MESSAGE } else { 0 }
            | if self.dict_original { Self::DICT_ORIGINAL } else { 0 }
    }

    /// The facts in `entry` if it was packed with `tag` (never for tag 0).
    fn unpack(entry: u64, tag: u32) -> Option<TypeFacts> {
        (tag != 0 && entry >> 32 == u64::from(tag)).then(|| TypeFacts {
            // Truncation intended: the low 16 bits are the kinds.
            #[allow(clippy::cast_possible_truncation)]
            kinds: Kinds::from_bits(entry as u16),
            dict_message: entry & Self::DICT_MESSAGE != 0,
            dict_original: entry & Self::DICT_ORIGINAL != 0,
        })
    }
}

/// Slots of a [`TypeCache`].
pub const TYPE_CACHE_SLOTS: usize = 256;

/// Facts of recently seen exception types, keyed by `tp_version_tag` alone (entry
/// `tag << 32 | facts`, in slot `tag % TYPE_CACHE_SLOTS` or the next one, so that a
/// wrapper and its inner error rarely evict each other).
///
/// `CPython` gives a type a new tag whenever it or one of its bases is modified
/// (`__bases__`, `__str__`, `message`, …) and never gives the same tag to two types
/// of an interpreter, so a hit describes the type as it is now; tag 0 (none
/// assigned) is never cached. One atomic word per entry: no lock, no torn entry,
/// nothing per thread.
pub struct TypeCache([AtomicU64; TYPE_CACHE_SLOTS]);

impl TypeCache {
    /// An empty cache (a `static`'s initializer).
    #[must_use]
    pub const fn new() -> Self {
        TypeCache([const { AtomicU64::new(0) }; TYPE_CACHE_SLOTS])
    }

    /// The two slots where the facts of the type with `tag` may be.
    #[inline]
    fn slots(&self, tag: u32) -> [&AtomicU64; 2] {
        let home = tag as usize % TYPE_CACHE_SLOTS;
        [&self.0[home], &self.0[(home + 1) % TYPE_CACHE_SLOTS]]
    }

    /// The facts cached for the type with `tag`, if any.
    #[inline]
    pub fn get(&self, tag: u32) -> Option<TypeFacts> {
        self.slots(tag)
            .into_iter()
            .find_map(|slot| TypeFacts::unpack(slot.load(Ordering::Relaxed), tag))
    }

    /// Keeps `facts` for the type with `tag` (not for tag 0): in the home slot if it
    /// is free, else in the next one (the home slot's entry is still someone's).
    pub fn put(&self, tag: u32, facts: TypeFacts) {
        if tag == 0 {
            return;
        }
        let [home, next] = self.slots(tag);
        let slot = if home.load(Ordering::Relaxed) == 0 { home } else { next };
        slot.store(facts.pack(tag), Ordering::Relaxed);
    }
}

impl Default for TypeCache {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::{TypeCache, TypeFacts, TYPE_CACHE_SLOTS};
    use crate::failure::{ErrorKind, Kinds};

    fn facts(kind: ErrorKind, dict_message: bool, dict_original: bool) -> TypeFacts {
        TypeFacts {
            kinds: Kinds::of(kind) | Kinds::of(ErrorKind::Unavailable),
            dict_message,
            dict_original,
        }
    }

    #[test]
    fn facts_read_back_under_their_tag_only() {
        let f = facts(ErrorKind::ClosureInput, true, false);
        let entry = f.pack(7);
        assert_eq!(TypeFacts::unpack(entry, 7), Some(f));
        assert_eq!(TypeFacts::unpack(entry, 8), None);
        let g = facts(ErrorKind::TypeError, false, true);
        assert_eq!(TypeFacts::unpack(g.pack(u32::MAX), u32::MAX), Some(g));
        // Tag 0 (none assigned) never hits, not even an empty slot.
        assert_eq!(TypeFacts::unpack(0, 0), None);
    }

    #[test]
    fn a_renewed_tag_misses() {
        let cache = TypeCache::new();
        cache.put(42, facts(ErrorKind::Aborted, false, false));
        assert!(cache.get(42).is_some());
        assert_eq!(cache.get(43), None);
        cache.put(0, facts(ErrorKind::Aborted, false, false));
        assert_eq!(cache.get(0), None);
    }

    #[test]
    fn a_colliding_type_takes_the_next_slot() {
        let cache = TypeCache::new();
        let (a, b) = (facts(ErrorKind::Cancelled, true, true), facts(ErrorKind::NotFound, false, false));
        let (ta, tb) = (5, 5 + TYPE_CACHE_SLOTS as u32);
        cache.put(ta, a);
        cache.put(tb, b);
        assert_eq!((cache.get(ta), cache.get(tb)), (Some(a), Some(b)));
        // The last slot's next one is the first.
        let last = TYPE_CACHE_SLOTS as u32 - 1;
        cache.put(last, a);
        cache.put(last + TYPE_CACHE_SLOTS as u32, b);
        assert_eq!(cache.get(last + TYPE_CACHE_SLOTS as u32), Some(b));
        assert_eq!(cache.get(last), Some(a));
    }
}
