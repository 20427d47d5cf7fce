//! Core enums that cross the waist as words: each variant's word, written once beside
//! the type (`crate::words!`), and read back. The binding turns a [`Words`] type into a
//! Python `str` and back without a table of its own.

/// A type whose values are words: `word` of each variant, `from_word` its inverse.
pub trait Words: Sized + Copy + 'static {
    /// Every variant, in declaration order.
    const ALL: &'static [Self];

    /// The variant's word.
    fn word(self) -> &'static str;

    /// The variant whose word is `word`.
    fn from_word(word: &str) -> Option<Self> {
        Self::ALL.iter().copied().find(|v| v.word() == word)
    }
}

/// `words!(Type { Type::Variant => "word", ... })`: the [`Words`] of `Type`.
#[macro_export]
macro_rules! words {
    ($ty:ty { $($variant:path => $word:literal),* $(,)? }) => {
        impl $crate::words::Words for $ty {
            const ALL: &'static [Self] = &[$($variant),*];

            fn word(self) -> &'static str {
                match self {
                    $($variant => $word),*
                }
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::Words;
    use crate::failure::lost_peer::Detection;
    use crate::failure::response::Question;
    use crate::ps_control::coordinator::{DrainEnd, ReleaseEnd};
    use crate::ps_control::drain::Outcome;
    use crate::ps_control::PollLog;
    use crate::ps_control::{Leave, ServeBound};

    /// Every word reads back as its variant, and no two variants share a word.
    fn round_trips<T: Words + PartialEq + std::fmt::Debug>() {
        for &v in T::ALL {
            assert_eq!(T::from_word(v.word()), Some(v));
        }
        assert_eq!(T::from_word("no such word"), None);
    }

    #[test]
    fn every_word_reads_back() {
        round_trips::<PollLog>();
        round_trips::<ReleaseEnd>();
        round_trips::<DrainEnd>();
        round_trips::<Outcome>();
        round_trips::<Question>();
        round_trips::<ServeBound>();
        round_trips::<Leave>();
        round_trips::<Detection>();
        assert_eq!(ServeBound::PeerTimeout.word(), "peer_timeout");
        assert_eq!(Question::from_word("derived cancellation"), Some(Question::DerivedCancellation));
    }
}
