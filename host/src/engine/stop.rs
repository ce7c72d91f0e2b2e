//! Stop strings: matched across token boundaries, left out of the output
//! unless asked for (vLLM's `include_stop_str_in_output`). Text that could
//! still be the start of a stop string is held back until it is resolved.

/// Watches generated text for stop strings.
#[derive(Clone, Debug, Default)]
pub struct StopMatcher {
    stops: Vec<String>,
    /// A matched stop string is released with the text before it.
    include: bool,
    /// Text received but not yet released.
    pending: String,
    /// The stop string that matched.
    matched: Option<usize>,
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
    /// A matcher for `stops` (empty strings are ignored); `include`: a
    /// matched stop string ends the released text.
    pub fn new(stops: Vec<String>, include: bool) -> Self {
        Self {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            include,
            pending: String::new(),
            matched: None,
        }
    }

    /// The stop string that matched, once one has.
    pub fn matched(&self) -> Option<&str> {
        self.matched.map(|i| self.stops[i].as_str())
    }

    /// Feeds new text.
    pub fn push(&mut self, text: &str) -> StopOutcome {
        if self.stops.is_empty() {
            return StopOutcome::Continue(text.to_owned());
        }
        self.pending.push_str(text);
        // The earliest match (the first stop string listed among those
        // that match there).
        if let Some((at, i)) = self
            .stops
            .iter()
            .enumerate()
            .filter_map(|(i, s)| Some((self.pending.find(s.as_str())?, i)))
            .min_by_key(|&(at, _)| at)
        {
            self.matched = Some(i);
            let end = if self.include {
                at + self.stops[i].len()
            } else {
                at
            };
            let released = self.pending[..end].to_owned();
            self.pending.clear();
            return StopOutcome::Stop(released);
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
        let mut m = StopMatcher::new(vec!["\n\nUser:".into(), "END".into()], false);
        assert_eq!(m.push("Hello"), StopOutcome::Continue("Hello".into()));
        assert_eq!(m.push(" world\n"), StopOutcome::Continue(" world".into()));
        assert_eq!(m.push("\nUs"), StopOutcome::Continue(String::new()));
        assert_eq!(m.push("er: hi"), StopOutcome::Stop(String::new()));
        let mut m = StopMatcher::new(vec!["END".into()], false);
        assert_eq!(m.push("abcEN"), StopOutcome::Continue("abc".into()));
        assert_eq!(m.push("x"), StopOutcome::Continue("ENx".into()));
        assert_eq!(m.push("yyEND tail"), StopOutcome::Stop("yy".into()));
        let mut m = StopMatcher::new(vec!["é!".into()], false);
        assert_eq!(m.push("café"), StopOutcome::Continue("caf".into()));
        assert_eq!(m.finish(), "é");
    }

    #[test]
    fn an_included_stop_string_ends_the_released_text() {
        let mut m = StopMatcher::new(vec!["END".into(), "EN".into()], true);
        assert_eq!(m.push("abcE"), StopOutcome::Continue("abc".into()));
        // Both match at the same place: the first listed is the one.
        assert_eq!(m.push("ND tail"), StopOutcome::Stop("END".into()));
        assert_eq!(m.matched(), Some("END"));
        let mut m = StopMatcher::new(vec!["\n\n".into(), "x".into()], true);
        assert_eq!(m.push("ab\n\ncdx"), StopOutcome::Stop("ab\n\n".into()));
    }
}
