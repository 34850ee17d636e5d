//! Path globs for rules and tracked matchers, and the normalisation of a
//! request path that they are matched against.
//!
//! `*` matches any run of characters except `/`, `**` matches anything. The
//! match is a dynamic programme over (pattern token, path byte) rather than
//! backtracking, so a hostile pattern such as `/**/**/**/x` against a long
//! path costs O(pattern × path), never exponential time.

/// One element of a compiled glob.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Token {
    /// A byte that must match exactly.
    Literal(u8),
    /// `*`: any run of bytes without `/`, possibly empty.
    Star,
    /// `**` (or more stars): any run of bytes, possibly empty.
    DoubleStar,
}

/// A compiled path glob.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Glob {
    tokens: Vec<Token>,
}

impl Glob {
    /// Compiles `pattern`; every string is a valid pattern.
    pub(crate) fn new(pattern: &str) -> Glob {
        let bytes = pattern.as_bytes();
        let mut tokens = Vec::with_capacity(bytes.len());
        let mut i = 0;
        while i < bytes.len() {
            if bytes[i] == b'*' {
                let start = i;
                while i < bytes.len() && bytes[i] == b'*' {
                    i += 1;
                }
                tokens.push(if i - start == 1 {
                    Token::Star
                } else {
                    Token::DoubleStar
                });
            } else {
                tokens.push(Token::Literal(bytes[i]));
                i += 1;
            }
        }
        Glob { tokens }
    }

    /// Whether the whole of `path` matches the glob.
    pub(crate) fn matches(&self, path: &str) -> bool {
        let text = path.as_bytes();
        let n = text.len();
        // reach[j]: the tokens seen so far match text[..j].
        let mut reach = vec![false; n + 1];
        reach[0] = true;
        let mut next = vec![false; n + 1];
        for token in &self.tokens {
            next.iter_mut().for_each(|r| *r = false);
            match token {
                Token::Literal(byte) => {
                    for j in 0..n {
                        if reach[j] && text[j] == *byte {
                            next[j + 1] = true;
                        }
                    }
                }
                Token::Star => {
                    // A star started at some reachable k extends up to, but
                    // not across, the next `/`.
                    let mut open = false;
                    for j in 0..=n {
                        open |= reach[j];
                        next[j] = open;
                        if j < n && text[j] == b'/' {
                            open = false;
                        }
                    }
                }
                Token::DoubleStar => {
                    let mut open = false;
                    for j in 0..=n {
                        open |= reach[j];
                        next[j] = open;
                    }
                }
            }
            std::mem::swap(&mut reach, &mut next);
            if !reach.iter().any(|r| *r) {
                return false;
            }
        }
        reach[n]
    }
}

/// The path a rule sees: the request path without any `/v1.NN` API version
/// prefix (the query string is never part of `Uri::path`).
///
/// The daemon routes `/v{version:[0-9.]+}/...` and `/...` to the same
/// handler, so a rule written once must match both spellings.
pub(crate) fn normalize_path(path: &str) -> &str {
    let Some(rest) = path.strip_prefix("/v") else {
        return path;
    };
    let digits = rest
        .bytes()
        .take_while(|b| b.is_ascii_digit() || *b == b'.')
        .count();
    if digits == 0 || !rest.as_bytes()[0].is_ascii_digit() {
        return path;
    }
    match &rest[digits..] {
        "" => "/",
        tail if tail.starts_with('/') => tail,
        _ => path,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(pattern: &str, path: &str) -> bool {
        Glob::new(pattern).matches(path)
    }

    #[test]
    fn literal_patterns_match_exactly() {
        assert!(m("/_ping", "/_ping"));
        assert!(!m("/_ping", "/_pin"));
        assert!(!m("/_ping", "/_ping/"));
        assert!(m("", ""));
        assert!(!m("", "/"));
    }

    #[test]
    fn star_stays_within_one_segment() {
        assert!(m("/containers/*/start", "/containers/abc123/start"));
        assert!(!m("/containers/*/start", "/containers/a/b/start"));
        assert!(m("/containers/*/start", "/containers//start"));
        assert!(m("/containers/*", "/containers/json"));
        assert!(!m("/containers/*", "/containers/x/json"));
        assert!(m("/exec/*/st*", "/exec/e1/start"));
        assert!(m("/*/*", "/a/b"));
        assert!(!m("/*", "/a/b"));
    }

    #[test]
    fn double_star_crosses_segments() {
        assert!(m("/**", "/containers/x/archive"));
        assert!(m("**", ""));
        assert!(m("/containers/**/json", "/containers/a/b/json"));
        assert!(m("/containers/**", "/containers/"));
        assert!(!m("/containers/**", "/images/x"));
        assert!(m("/***", "/a/b"));
    }

    #[test]
    fn hostile_patterns_finish_quickly() {
        let path = format!("/{}", "a/".repeat(2000));
        let pattern = format!("{}x", "/**".repeat(200));
        assert!(!m(&pattern, &path));
    }

    #[test]
    fn version_prefix_is_stripped() {
        assert_eq!(normalize_path("/v1.41/containers/json"), "/containers/json");
        assert_eq!(normalize_path("/v1.41"), "/");
        assert_eq!(normalize_path("/v2/_ping"), "/_ping");
        assert_eq!(normalize_path("/containers/json"), "/containers/json");
        assert_eq!(normalize_path("/volumes/x"), "/volumes/x");
        assert_eq!(normalize_path("/v.1/x"), "/v.1/x");
        assert_eq!(normalize_path("/v1.41x/y"), "/v1.41x/y");
        assert_eq!(normalize_path("/v"), "/v");
        assert_eq!(normalize_path(""), "");
    }
}
