//! Python's view of template values: `str()` for printing, `json.dumps` for
//! `tojson`, and JSON input parsed with its key order kept (Python dicts keep
//! insertion order; minijinja's own maps are sorted).

use std::fmt::Write as _;
use std::sync::Arc;

use minijinja::value::{Enumerator, Kwargs, Object, ObjectRepr, ValueKind};
use minijinja::{Error, ErrorKind, Output, State, Value};
use serde::de::{Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

/// A map that keeps its keys in insertion order, like a Python dict.
#[derive(Debug, Default)]
pub(super) struct OrderedMap(Vec<(Value, Value)>);

impl OrderedMap {
    /// Sets `key`, keeping the position of an earlier entry with that key.
    pub(super) fn insert(&mut self, key: Value, value: Value) {
        match self.0.iter_mut().find(|(k, _)| *k == key) {
            Some(entry) => entry.1 = value,
            None => self.0.push((key, value)),
        }
    }

    pub(super) fn into_value(self) -> Value {
        Value::from_object(self)
    }
}

impl Object for OrderedMap {
    fn repr(self: &Arc<Self>) -> ObjectRepr {
        ObjectRepr::Map
    }

    fn get_value(self: &Arc<Self>, key: &Value) -> Option<Value> {
        self.0
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    }

    fn enumerate(self: &Arc<Self>) -> Enumerator {
        Enumerator::Values(self.0.iter().map(|(k, _)| k.clone()).collect())
    }

    fn enumerator_len(self: &Arc<Self>) -> Option<usize> {
        Some(self.0.len())
    }
}

/// Parses JSON text into template values, keeping object key order.
pub(super) fn parse_json(text: &str) -> Result<Value, serde_json::Error> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let JsonValue(value) = JsonValue::deserialize(&mut deserializer)?;
    deserializer.end()?;
    Ok(value)
}

struct JsonValue(Value);

impl<'de> Deserialize<'de> for JsonValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(JsonVisitor)
    }
}

struct JsonVisitor;

impl<'de> Visitor<'de> for JsonVisitor {
    type Value = JsonValue;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<JsonValue, E> {
        Ok(JsonValue(Value::from(v)))
    }

    fn visit_i64<E>(self, v: i64) -> Result<JsonValue, E> {
        Ok(JsonValue(Value::from(v)))
    }

    fn visit_u64<E>(self, v: u64) -> Result<JsonValue, E> {
        Ok(JsonValue(Value::from(v)))
    }

    fn visit_f64<E>(self, v: f64) -> Result<JsonValue, E> {
        Ok(JsonValue(Value::from(v)))
    }

    fn visit_str<E>(self, v: &str) -> Result<JsonValue, E> {
        Ok(JsonValue(Value::from(v)))
    }

    fn visit_unit<E>(self) -> Result<JsonValue, E> {
        Ok(JsonValue(Value::from(())))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<JsonValue, A::Error> {
        let mut items = Vec::new();
        while let Some(JsonValue(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(JsonValue(Value::from(items)))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<JsonValue, A::Error> {
        let mut object = OrderedMap::default();
        while let Some((key, JsonValue(value))) = map.next_entry::<String, JsonValue>()? {
            object.insert(Value::from(key), value);
        }
        Ok(JsonValue(object.into_value()))
    }
}

/// The template formatter: prints values as Python's `str()` does (`None`,
/// `True`, `1.0`, `['a', 1]`), strings and everything else as minijinja does.
pub(super) fn format_value(
    out: &mut Output,
    state: &mut State,
    value: &Value,
) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None | ValueKind::Bool | ValueKind::Number | ValueKind::Seq | ValueKind::Map => {
            let mut text = String::new();
            write_repr(&mut text, value)?;
            out.write_str(&text).map_err(Error::from)
        }
        _ => minijinja::escape_formatter(out, state, value),
    }
}

/// Python's `repr()` of a value (what `str()` shows inside containers).
fn write_repr(out: &mut String, value: &Value) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("None"),
        ValueKind::Bool => out.push_str(if value.is_true() { "True" } else { "False" }),
        ValueKind::Number => out.push_str(&number(value, false)?),
        ValueKind::String => write_str_repr(out, value.as_str().unwrap_or_default()),
        ValueKind::Seq => {
            out.push('[');
            for (i, item) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, &item)?;
            }
            out.push(']');
        }
        ValueKind::Map => {
            out.push('{');
            for (i, key) in value.try_iter()?.enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_repr(out, &key)?;
                out.push_str(": ");
                write_repr(out, &value.get_item(&key)?)?;
            }
            out.push('}');
        }
        _ => out.push_str(&value.to_string()),
    }
    Ok(())
}

/// Python's `repr()` of a string. Printability of non-ASCII characters is
/// approximated (unassigned code points count as printable).
fn write_str_repr(out: &mut String, s: &str) {
    let quote = if s.contains('\'') && !s.contains('"') {
        '"'
    } else {
        '\''
    };
    out.push(quote);
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c == quote => {
                out.push('\\');
                out.push(c);
            }
            c if !is_printable(c) => {
                let code = u32::from(c);
                // Writing to a String cannot fail.
                let _ = match code {
                    0..=0xff => write!(out, "\\x{code:02x}"),
                    0x100..=0xffff => write!(out, "\\u{code:04x}"),
                    _ => write!(out, "\\U{code:08x}"),
                };
            }
            c => out.push(c),
        }
    }
    out.push(quote);
}

/// Python's `str.isprintable()` for one character: not a control, format,
/// separator (other than the space) or private-use character.
fn is_printable(c: char) -> bool {
    if c == ' ' {
        return true;
    }
    let format_or_private = matches!(
        u32::from(c),
        0xad | 0x600..=0x605 | 0x61c | 0x6dd | 0x70f | 0x180e | 0x200b..=0x200f
            | 0x202a..=0x202e | 0x2060..=0x2064 | 0x2066..=0x206f | 0xfeff | 0xfff9..=0xfffb
            | 0xe000..=0xf8ff | 0xe0001 | 0xe0020..=0xe007f | 0xf0000..
    );
    !(c.is_control() || c.is_whitespace() || format_or_private)
}

/// A number as Python prints it (`repr`), or as `json.dumps` does.
fn number(value: &Value, json: bool) -> Result<String, Error> {
    if value.is_integer() {
        return Ok(value.to_string());
    }
    let f = f64::try_from(value.clone())?;
    Ok(match (f.is_nan(), f.is_infinite(), json) {
        (true, _, false) => "nan".to_owned(),
        (true, _, true) => "NaN".to_owned(),
        (_, true, false) => if f > 0.0 { "inf" } else { "-inf" }.to_owned(),
        (_, true, true) => if f > 0.0 { "Infinity" } else { "-Infinity" }.to_owned(),
        _ => float_repr(f),
    })
}

/// Python's `repr(float)`: the shortest round-tripping digits, positional for
/// decimal exponents in -4..16, scientific (`1e-05`, `1.5e+16`) otherwise.
fn float_repr(f: f64) -> String {
    let scientific = format!("{f:e}");
    let (mantissa, exponent) = scientific.split_once('e').unwrap_or((&scientific, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let (sign, mantissa) = match mantissa.strip_prefix('-') {
        Some(rest) => ("-", rest),
        None => ("", mantissa),
    };
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    if !(-4..16).contains(&exponent) {
        return format!(
            "{sign}{mantissa}e{}{:02}",
            if exponent < 0 { '-' } else { '+' },
            exponent.abs()
        );
    }
    let point = exponent + 1;
    if point <= 0 {
        let zeros = "0".repeat(point.unsigned_abs() as usize);
        return format!("{sign}0.{zeros}{digits}");
    }
    let point = point as usize;
    if digits.len() <= point {
        format!("{sign}{digits}{}.0", "0".repeat(point - digits.len()))
    } else {
        format!("{sign}{}.{}", &digits[..point], &digits[point..])
    }
}

/// Options of transformers' `tojson` filter (Python's `json.dumps`).
struct DumpOptions {
    ensure_ascii: bool,
    indent: Option<String>,
    item_separator: String,
    key_separator: String,
    sort_keys: bool,
}

/// transformers' `tojson` filter: `json.dumps(x, ensure_ascii=False,
/// indent=None, separators=None, sort_keys=False)`, with those keyword
/// arguments; no HTML escaping.
pub(super) fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let ensure_ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    let sort_keys = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let indent = match kwargs.get::<Option<Value>>("indent")? {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(match v.as_str() {
            Some(s) => s.to_owned(),
            None => " ".repeat(usize::try_from(i64::try_from(v)?).unwrap_or(0)),
        }),
    };
    let (item_separator, key_separator) = match kwargs.get::<Option<Vec<String>>>("separators")? {
        Some(pair) => match <[String; 2]>::try_from(pair) {
            Ok([item, key]) => (item, key),
            Err(_) => {
                return Err(Error::new(
                    ErrorKind::InvalidOperation,
                    "tojson: separators must be an (item_separator, key_separator) pair",
                ))
            }
        },
        None if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
    };
    kwargs.assert_all_used()?;
    let options = DumpOptions {
        ensure_ascii,
        indent,
        item_separator,
        key_separator,
        sort_keys,
    };
    let mut out = String::new();
    dump(&mut out, value, &options, 0)?;
    Ok(Value::from(out))
}

fn not_serializable(value: &Value) -> Error {
    Error::new(
        ErrorKind::InvalidOperation,
        format!(
            "tojson: a value of type {} is not JSON serializable",
            value.kind()
        ),
    )
}

fn dump(out: &mut String, value: &Value, options: &DumpOptions, level: usize) -> Result<(), Error> {
    match value.kind() {
        ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => out.push_str(&number(value, true)?),
        ValueKind::String => write_json_str(
            out,
            value.as_str().unwrap_or_default(),
            options.ensure_ascii,
        ),
        ValueKind::Seq => {
            let items: Vec<Value> = value.try_iter()?.collect();
            dump_container(out, ('[', ']'), items.len(), options, level, |out, i| {
                dump(out, &items[i], options, level + 1)
            })?;
        }
        ValueKind::Map => {
            let mut entries = value
                .try_iter()?
                .map(|key| Ok((json_key(&key)?, value.get_item(&key)?)))
                .collect::<Result<Vec<_>, Error>>()?;
            if options.sort_keys {
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
            dump_container(out, ('{', '}'), entries.len(), options, level, |out, i| {
                let (key, item) = &entries[i];
                write_json_str(out, key, options.ensure_ascii);
                out.push_str(&options.key_separator);
                dump(out, item, options, level + 1)
            })?;
        }
        _ => return Err(not_serializable(value)),
    }
    Ok(())
}

fn dump_container(
    out: &mut String,
    (open, close): (char, char),
    len: usize,
    options: &DumpOptions,
    level: usize,
    mut item: impl FnMut(&mut String, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if len > 0 {
        let newline = |out: &mut String, level: usize| {
            if let Some(indent) = &options.indent {
                out.push('\n');
                out.push_str(&indent.repeat(level));
            }
        };
        for i in 0..len {
            if i > 0 {
                out.push_str(&options.item_separator);
            }
            newline(out, level + 1);
            item(out, i)?;
        }
        newline(out, level);
    }
    out.push(close);
    Ok(())
}

/// A dict key as `json.dumps` writes it: strings as they are, numbers,
/// booleans and None converted; anything else is an error.
fn json_key(key: &Value) -> Result<String, Error> {
    match key.kind() {
        ValueKind::String => Ok(key.as_str().unwrap_or_default().to_owned()),
        ValueKind::Number => number(key, true),
        ValueKind::Bool => Ok(if key.is_true() { "true" } else { "false" }.to_owned()),
        ValueKind::None => Ok("null".to_owned()),
        _ => Err(Error::new(
            ErrorKind::InvalidOperation,
            format!(
                "tojson: keys must be str, int, float, bool or None, not {}",
                key.kind()
            ),
        )),
    }
}

fn write_json_str(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if c < ' ' || (ensure_ascii && !(' '..='~').contains(&c)) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    // Writing to a String cannot fail.
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_print_like_python() {
        let cases = [
            (1.0, "1.0"),
            (-0.0, "-0.0"),
            (0.1, "0.1"),
            (2.5, "2.5"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e16, "1e+16"),
            (1e15, "1000000000000000.0"),
            (123456.789, "123456.789"),
            (1.5e300, "1.5e+300"),
            (-2.5e-7, "-2.5e-07"),
        ];
        for (f, want) in cases {
            assert_eq!(float_repr(f), want, "{f}");
        }
    }

    #[test]
    fn strings_repr_like_python() {
        let repr = |s: &str| {
            let mut out = String::new();
            write_str_repr(&mut out, s);
            out
        };
        assert_eq!(repr("it's"), "\"it's\"");
        assert_eq!(repr("a'b\"c"), "'a\\'b\"c'");
        assert_eq!(
            repr("tab\there\u{1}é\u{a0}\u{200b}"),
            "'tab\\there\\x01é\\xa0\\u200b'"
        );
    }

    #[test]
    fn json_keeps_key_order() {
        let value = parse_json(r#"{"z": 1, "a": [true, null, 1.5, "é\n"], "m": {}}"#).unwrap();
        let options = DumpOptions {
            ensure_ascii: false,
            indent: None,
            item_separator: ", ".into(),
            key_separator: ": ".into(),
            sort_keys: false,
        };
        let mut out = String::new();
        dump(&mut out, &value, &options, 0).unwrap();
        assert_eq!(out, r#"{"z": 1, "a": [true, null, 1.5, "é\n"], "m": {}}"#);

        let ascii = DumpOptions {
            ensure_ascii: true,
            sort_keys: true,
            ..options
        };
        let mut out = String::new();
        dump(&mut out, &value, &ascii, 0).unwrap();
        assert_eq!(
            out,
            r#"{"a": [true, null, 1.5, "\u00e9\n"], "m": {}, "z": 1}"#
        );
        assert!(parse_json("[1,").is_err());
    }
}
