//! Choices for the property tests here and in the xds-server, drawn from a sequence of words
//! proptest generates (`proptest::collection::vec(any::<u64>(), ..)`): a test's generators ask
//! "which of `n`?" and each answer is the next word modulo `n`. proptest runs the cases and,
//! when one fails, shrinks the sequence (fewer words, smaller words: earlier, simpler choices)
//! to a short failing run, which a seeded generator cannot do. A spent sequence answers 0, so a
//! generator always ends.

/// A sequence of choices; see the module documentation.
pub struct Choices {
    words: Vec<u64>,
    at: usize,
}

impl Choices {
    pub fn new(words: Vec<u64>) -> Self {
        Choices { words, at: 0 }
    }

    #[allow(clippy::should_implement_trait)] // an endless source, not an iterator
    pub fn next(&mut self) -> u64 {
        let word = self.words.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        word
    }

    /// One of `0..n` (`n` > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// True with about `percent` in 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

/// Runs `check` on `cases` choice sequences of up to `words` words that proptest generates; a
/// failing sequence is shrunk and reported with the failure.
pub fn for_choices(cases: u32, words: usize, check: impl Fn(Choices)) {
    use proptest::prelude::*;
    let config = ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let strategy = proptest::collection::vec(any::<u64>(), 0..words);
    let mut runner = proptest::test_runner::TestRunner::new(config);
    if let Err(failure) = runner.run(&strategy, |sequence| {
        check(Choices::new(sequence));
        Ok(())
    }) {
        panic!("{failure}");
    }
}
