//! Stop strings: matched across token boundaries, never included in the
//! output. Text that could still be the start of a stop string is held back
//! until it is resolved.

/// Watches generated text for stop strings.
#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// Text received but not yet released.
    pending: String,
}

/// What to do with new text.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StopOutcome {
    /// Release this text (possibly empty: held back for now).
    Continue(String),
    /// A stop string matched: release this text (before it) and stop.
    Stop(String),
}

impl StopMatcher {
    /// A matcher for `stops` (empty strings are ignored).
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            pending: String::new(),
        }
    }

    /// Feeds new text.
    pub fn push(&mut self, text: &str) -> StopOutcome {
        if self.stops.is_empty() {
            return StopOutcome::Continue(text.to_owned());
        }
        self.pending.push_str(text);
        if let Some(at) = self
            .stops
            .iter()
            .filter_map(|s| self.pending.find(s.as_str()))
            .min()
        {
            let before = self.pending[..at].to_owned();
            self.pending.clear();
            return StopOutcome::Stop(before);
        }
        // Hold back the longest suffix that starts some stop string.
        let hold = self
            .stops
            .iter()
            .flat_map(|s| {
                (1..s.len())
                    .filter(move |&n| s.is_char_boundary(n))
                    .map(move |n| &s[..n])
            })
            .filter(|prefix| self.pending.ends_with(prefix))
            .map(str::len)
            .max()
            .unwrap_or(0);
        let release = self.pending.len() - hold;
        let out = self.pending[..release].to_owned();
        self.pending.drain(..release);
        StopOutcome::Continue(out)
    }

    /// The text still held back (released when generation ends otherwise).
    pub fn finish(&mut self) -> String {
        std::mem::take(&mut self.pending)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_strings_match_across_pieces_and_are_excluded() {
        let mut m = StopMatcher::new(vec!["\n\nUser:".into(), "END".into()]);
        assert_eq!(m.push("Hello"), StopOutcome::Continue("Hello".into()));
        assert_eq!(m.push(" world\n"), StopOutcome::Continue(" world".into()));
        assert_eq!(m.push("\nUs"), StopOutcome::Continue(String::new()));
        assert_eq!(m.push("er: hi"), StopOutcome::Stop(String::new()));
        let mut m = StopMatcher::new(vec!["END".into()]);
        assert_eq!(m.push("abcEN"), StopOutcome::Continue("abc".into()));
        assert_eq!(m.push("x"), StopOutcome::Continue("ENx".into()));
        assert_eq!(m.push("yyEND tail"), StopOutcome::Stop("yy".into()));
        let mut m = StopMatcher::new(vec!["é!".into()]);
        assert_eq!(m.push("café"), StopOutcome::Continue("caf".into()));
        assert_eq!(m.finish(), "é");
    }
}
