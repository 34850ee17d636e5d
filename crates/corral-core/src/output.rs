//! Capped output: keep the head and the tail of a stream, count the rest.
//!
//! A command may print gigabytes; an agent wants the beginning (what ran) and
//! the end (how it failed). [`HeadTail`] keeps the first half of the budget as
//! it arrives (so it can be streamed live) and a ring of the last half, and
//! counts every byte. Memory stays bounded by the budget whatever the command
//! writes.

use std::collections::VecDeque;

/// Where a pushed chunk went.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Pushed<'a> {
    /// The part of the chunk that belongs to the head, to be streamed now.
    pub head: &'a [u8],
}

/// A head-and-tail capped byte stream.
#[derive(Debug, Clone)]
pub struct HeadTail {
    head_cap: usize,
    tail_cap: usize,
    head_len: usize,
    tail: VecDeque<u8>,
    total: u64,
}

impl HeadTail {
    /// A capper keeping at most `budget` bytes: `budget / 2` (rounded up) of
    /// head and the rest of tail.
    pub fn new(budget: u64) -> Self {
        let budget = usize::try_from(budget).unwrap_or(usize::MAX);
        let head_cap = budget - budget / 2;
        HeadTail {
            head_cap,
            tail_cap: budget / 2,
            head_len: 0,
            tail: VecDeque::new(),
            total: 0,
        }
    }

    /// Takes a chunk; returns the part of it that extends the head.
    pub fn push<'a>(&mut self, chunk: &'a [u8]) -> Pushed<'a> {
        self.total += chunk.len() as u64;
        let room = self.head_cap - self.head_len;
        let (head, rest) = chunk.split_at(room.min(chunk.len()));
        self.head_len += head.len();
        if self.tail_cap > 0 && !rest.is_empty() {
            let rest = if rest.len() > self.tail_cap {
                &rest[rest.len() - self.tail_cap..]
            } else {
                rest
            };
            let overflow = (self.tail.len() + rest.len()).saturating_sub(self.tail_cap);
            self.tail.drain(..overflow);
            self.tail.extend(rest);
        }
        Pushed { head }
    }

    /// Bytes seen in all.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// True when bytes were dropped between head and tail.
    pub fn truncated(&self) -> bool {
        self.total > (self.head_len + self.tail.len()) as u64
    }

    /// Takes the kept tail (the bytes after the head), leaving it empty.
    pub fn take_tail(&mut self) -> Vec<u8> {
        self.tail.drain(..).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(budget: u64, chunks: &[&[u8]]) -> (Vec<u8>, Vec<u8>, bool, u64) {
        let mut h = HeadTail::new(budget);
        let mut head = Vec::new();
        for c in chunks {
            head.extend_from_slice(h.push(c).head);
        }
        let t = h.truncated();
        let total = h.total();
        (head, h.take_tail(), t, total)
    }

    #[test]
    fn short_output_is_kept_whole() {
        let (head, tail, truncated, total) = run(10, &[b"abc", b"defg"]);
        assert_eq!(head, b"abcde");
        assert_eq!(tail, b"fg");
        assert!(!truncated);
        assert_eq!(total, 7);
    }

    #[test]
    fn long_output_keeps_head_and_last_bytes() {
        let data: Vec<u8> = (0..=255u8).cycle().take(10_000).collect();
        let chunks: Vec<&[u8]> = data.chunks(333).collect();
        let (head, tail, truncated, total) = run(100, &chunks);
        assert_eq!(head, &data[..50]);
        assert_eq!(tail, &data[data.len() - 50..]);
        assert!(truncated);
        assert_eq!(total, 10_000);
    }

    #[test]
    fn exact_budget_is_not_truncated() {
        let (head, tail, truncated, _) = run(4, &[b"ab", b"cd"]);
        assert_eq!([head, tail].concat(), b"abcd");
        assert!(!truncated);
        let (_, _, truncated, _) = run(4, &[b"abcde"]);
        assert!(truncated);
    }

    #[test]
    fn zero_budget_keeps_nothing_but_counts() {
        let (head, tail, truncated, total) = run(0, &[b"xyz"]);
        assert!(head.is_empty() && tail.is_empty());
        assert!(truncated);
        assert_eq!(total, 3);
    }
}
