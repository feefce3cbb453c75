//! Request bodies read with their input lists bounded while they are
//! deserialised: a list with more inputs than a request may carry is
//! refused at the first one too many, the rest of the body unread; one
//! that fits the limit but not the queue's free places now is refused
//! (429) with the inputs past those places counted, not deserialised.
//! Under overload most requests are turned away, and the parse is a large
//! part of a request's cost on the handlers (a third of a 200's, by
//! `perf`): a refused request costs the inputs the queue had room for.
//!
//! serde's derive hands a field's `Deserialize` nothing but the
//! deserializer, so the bounds reach the lists' visitor
//! ([`bounded_seq`]) through a thread-local that [`parse`] sets for its
//! one synchronous call and puts back after it: the request types stay
//! plain derives. Outside [`parse`] a list is unbounded. A bounded list
//! must not sit under a derived `#[serde(untagged)]` enum, which would
//! buffer it whole first and could try another variant after a refusal.

use std::cell::Cell;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, DeserializeOwned, IgnoredAny, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};

/// How many inputs a request's list may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limits {
    /// The most a request may carry.
    most: usize,
    /// The queue's free places now.
    room: usize,
    /// Inputs of the request counted before the list.
    before: usize,
}

impl Limits {
    /// No limit: a list outside [`parse`].
    const NONE: Limits = Limits {
        most: usize::MAX,
        room: usize::MAX,
        before: 0,
    };

    /// At most `most` inputs, and no more than `room`, the queue's free
    /// places (`usize::MAX` for a route that queues nothing).
    pub(crate) fn new(most: usize, room: usize) -> Self {
        Self {
            most,
            room,
            before: 0,
        }
    }

    /// For a list that comes after `n` inputs of the same request
    /// (`/similarity`'s source sentence): they count against both bounds.
    #[cfg_attr(not(feature = "tei"), allow(dead_code))]
    pub(crate) fn after(self, n: usize) -> Self {
        Self {
            most: self.most.saturating_sub(n),
            room: self.room.saturating_sub(n),
            before: self.before + n,
        }
    }
}

/// A list past its bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Overflow {
    /// More than `most` inputs: `at_least` counted, and the rest unread.
    TooMany { at_least: usize, most: usize },
    /// `inputs`, within the limit, but more than the queue has room for.
    NoRoom { inputs: usize },
}

impl fmt::Display for Overflow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Overflow::TooMany { at_least, most } => {
                write!(
                    f,
                    "at least {at_least} inputs, more than the {most} allowed"
                )
            }
            Overflow::NoRoom { inputs } => write!(f, "no room in the queue for {inputs} inputs"),
        }
    }
}

/// Why a body was not read as its request.
#[derive(Debug)]
pub(crate) enum Refused {
    /// Its input list past its bounds.
    Overflow(Overflow),
    /// Not JSON (`is_data()` false), or not the request's shape.
    Json(serde_json::Error),
}

#[derive(Clone, Copy)]
struct Scope {
    limits: Limits,
    overflow: Option<Overflow>,
}

thread_local! {
    static SCOPE: Cell<Scope> = const {
        Cell::new(Scope {
            limits: Limits::NONE,
            overflow: None,
        })
    };
}

/// Puts the scope it was made with back on drop (a panic included).
struct Restore(Scope);

impl Drop for Restore {
    fn drop(&mut self) {
        SCOPE.set(self.0);
    }
}

/// `body` read as a `T` whose input lists ([`Batch`], and the types that
/// read theirs with [`bounded_seq`]) are held to `limits`.
pub(crate) fn parse<T: DeserializeOwned>(body: &[u8], limits: Limits) -> Result<T, Refused> {
    let _restore = Restore(SCOPE.replace(Scope {
        limits,
        overflow: None,
    }));
    let parsed = serde_json::from_slice(body);
    match (parsed, SCOPE.get().overflow) {
        (_, Some(o)) => Err(Refused::Overflow(o)),
        (Ok(t), None) => Ok(t),
        (Err(e), None) => Err(Refused::Json(e)),
    }
}

/// The rest of `seq` after `items` (elements its caller read already,
/// each one input), within the bounds of the [`parse`] under way: an
/// error at the first element past `most`, leaving the rest of the body
/// unread; past the queue's room, the elements are skipped and counted up
/// to `most`, and the list refused at its end.
pub(crate) fn bounded_seq<'de, T, A>(mut seq: A, mut items: Vec<T>) -> Result<Vec<T>, A::Error>
where
    T: Deserialize<'de>,
    A: SeqAccess<'de>,
{
    let Limits { most, room, before } = SCOPE.get().limits;
    let mut count = items.len();
    loop {
        if count >= most {
            if seq.next_element::<IgnoredAny>()?.is_none() {
                break;
            }
            return Err(overflow(Overflow::TooMany {
                at_least: before + count + 1,
                most: before + most,
            }));
        }
        if count >= room {
            if seq.next_element::<IgnoredAny>()?.is_none() {
                break;
            }
        } else {
            match seq.next_element()? {
                Some(t) => items.push(t),
                None => break,
            }
        }
        count += 1;
    }
    if count > room {
        return Err(overflow(Overflow::NoRoom {
            inputs: before + count,
        }));
    }
    Ok(items)
}

/// `o` recorded for [`parse`], and the error that stops the parse.
fn overflow<E: de::Error>(o: Overflow) -> E {
    SCOPE.set(Scope {
        overflow: Some(o),
        ..SCOPE.get()
    });
    E::custom(o)
}

/// A JSON array of inputs, bounded while it is read ([`bounded_seq`]).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Batch<T>(pub(crate) Vec<T>);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Batch<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Array<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for Array<T> {
            type Value = Vec<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Vec<T>, A::Error> {
                bounded_seq(seq, Vec::new())
            }
        }
        d.deserialize_seq(Array(PhantomData)).map(Batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    struct Req {
        inputs: Batch<u32>,
        #[serde(default)]
        flag: bool,
    }

    fn read(body: &str, most: usize, room: usize) -> Result<Vec<u32>, Refused> {
        parse::<Req>(body.as_bytes(), Limits::new(most, room)).map(|r| r.inputs.0)
    }

    fn overflow_of(r: Result<Vec<u32>, Refused>) -> Overflow {
        match r {
            Err(Refused::Overflow(o)) => o,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_list_within_its_bounds_is_read_whole() {
        assert_eq!(read(r#"{"inputs": [1, 2, 3]}"#, 3, 3).unwrap(), [1, 2, 3]);
        assert_eq!(read(r#"{"inputs": []}"#, 3, 0).unwrap(), Vec::<u32>::new());
        let r: Req = parse(br#"{"flag": true, "inputs": [7]}"#, Limits::new(1, 1)).unwrap();
        assert!(r.flag);
    }

    /// The parse stops at the first input past the limit: what follows it
    /// is never read (here it is not even JSON).
    #[test]
    fn a_list_past_its_limit_stops_at_limit_plus_one() {
        let o = overflow_of(read(r#"{"inputs": [1, 2, 3, 4, this is not read"#, 3, 10));
        assert_eq!(
            o,
            Overflow::TooMany {
                at_least: 4,
                most: 3
            }
        );
        // Past the limit is refused as such whatever the queue's room.
        let o = overflow_of(read(r#"{"inputs": [1, 2, 3, 4]}"#, 3, 0));
        assert!(matches!(o, Overflow::TooMany { .. }), "{o:?}");
    }

    /// Within the limit but past the queue's room: the inputs past the
    /// room are counted, not deserialised (a wrong type there is not
    /// seen), and the list refused at its end.
    #[test]
    fn a_list_past_the_queues_room_is_counted_not_read() {
        let o = overflow_of(read(r#"{"inputs": [1, "x", {"y": []}]}"#, 10, 1));
        assert_eq!(o, Overflow::NoRoom { inputs: 3 });
        let e = read(r#"{"inputs": ["x", 1]}"#, 10, 1);
        assert!(
            matches!(e, Err(Refused::Json(ref e)) if e.is_data()),
            "{e:?}"
        );
    }

    #[test]
    fn inputs_before_the_list_count_against_both_bounds() {
        let limits = Limits::new(3, 10).after(1);
        let o = parse::<Batch<u32>>(b"[1, 2, 3]", limits).unwrap_err();
        assert!(
            matches!(
                o,
                Refused::Overflow(Overflow::TooMany {
                    at_least: 4,
                    most: 3
                })
            ),
            "{o:?}"
        );
        let o = parse::<Batch<u32>>(b"[1, 2]", Limits::new(10, 2).after(1)).unwrap_err();
        assert!(
            matches!(o, Refused::Overflow(Overflow::NoRoom { inputs: 3 })),
            "{o:?}"
        );
    }

    #[test]
    fn bad_json_is_told_apart_from_the_wrong_shape() {
        let syntax = read(r#"{"inputs": [1, "#, 10, 10);
        assert!(matches!(syntax, Err(Refused::Json(ref e)) if !e.is_data()));
        let shape = read(r#"{"inputs": 1}"#, 10, 10);
        assert!(matches!(shape, Err(Refused::Json(ref e)) if e.is_data()));
    }

    /// The bounds hold for one parse only: a list read after it, or a
    /// parse that failed, sees none.
    #[test]
    fn the_bounds_are_put_back_after_each_parse() {
        let _ = read(r#"{"inputs": [1, 2]}"#, 1, 1);
        let many: Batch<u32> = serde_json::from_str("[1, 2, 3]").unwrap();
        assert_eq!(many.0.len(), 3);
        assert_eq!(SCOPE.get().limits, Limits::NONE);
        assert_eq!(SCOPE.get().overflow, None);
    }
}
