//! Chat templates, rendered like transformers' `apply_chat_template`.
//!
//! transformers renders with a sandboxed Jinja2 environment with
//! `trim_blocks` and `lstrip_blocks`, no trailing newline kept, no HTML
//! escaping, the `loopcontrols` extension, its own `tojson` filter and the
//! globals `raise_exception` and `strftime_now`; the variables are the
//! messages, `tools`, `documents`, `add_generation_prompt`, the special tokens
//! (`bos_token`, `eos_token`, ...) and any extra keyword arguments. This module
//! sets up minijinja the same way, prints values as Python would (`None`,
//! `True`, `['a']`), keeps dict key order, provides Python's string and dict
//! methods (`minijinja-contrib`'s pycompat), and treats `{% generation %}`
//! blocks (transformers' assistant-mask tag) as plain content.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::syntax::SyntaxConfig;
use minijinja::value::ValueKind;
use minijinja::{AutoEscape, Environment, Error, ErrorKind, Value};

use super::pyjson::{self, OrderedMap};
use super::TokenizerError;

const TEMPLATE_NAME: &str = "chat_template";

/// One chat message with plain text content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`, ...
    pub role: String,
    /// The message text.
    pub content: String,
}

impl ChatMessage {
    /// A message with a role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }

    fn to_value(&self) -> Value {
        let mut map = OrderedMap::default();
        map.insert(Value::from("role"), Value::from(self.role.as_str()));
        map.insert(Value::from("content"), Value::from(self.content.as_str()));
        map.into_value()
    }
}

/// The arguments of `apply_chat_template` as JSON text, for conversations
/// beyond plain `{role, content}` messages (tool calls, content parts, ...).
/// Object key order is kept, as Python keeps it.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChatRequest<'a> {
    /// A JSON array of message objects.
    pub messages: &'a str,
    /// A JSON array of tool schemas (`tools`), if any.
    pub tools: Option<&'a str>,
    /// A JSON array of documents (`documents`), if any.
    pub documents: Option<&'a str>,
    /// Whether to end with the prompt for the assistant's reply.
    pub add_generation_prompt: bool,
    /// A JSON object of extra template variables (transformers' `**kwargs`,
    /// e.g. `{"enable_thinking": false}`); they override the special tokens.
    pub variables: Option<&'a str>,
    /// Leave the final message open for the model to continue
    /// (transformers' `continue_final_message`): the rendering ends where
    /// that message's text does.
    pub continue_final_message: bool,
}

/// What transformers appends to the text of the message to continue, to
/// find where that text ends in the rendering.
const CONTINUE_TAG: &str = "CONTINUE_FINAL_MESSAGE_TAG ";

/// A compiled chat template.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    /// Variables every rendering sees (the special tokens).
    variables: Vec<(String, Value)>,
}

impl ChatTemplate {
    /// Compiles a chat template (Jinja source, e.g. `tokenizer.chat_template`).
    pub fn new(source: &str) -> Result<Self, TokenizerError> {
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()
            .map_err(TokenizerError::TemplateSyntax)?;
        env.set_syntax(syntax);
        env.set_auto_escape_callback(|_| AutoEscape::None);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.set_formatter(pyjson::format_value);
        env.add_filter("tojson", pyjson::tojson);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(TEMPLATE_NAME, rewrite_generation_tags(source).into_owned())
            .map_err(TokenizerError::TemplateSyntax)?;
        Ok(Self {
            env,
            variables: Vec::new(),
        })
    }

    /// Adds string variables every rendering sees, such as
    /// `("bos_token", "<s>")` (see `SpecialTokens::template_variables`).
    pub fn with_variables<N: Into<String>>(
        mut self,
        variables: impl IntoIterator<Item = (N, String)>,
    ) -> Self {
        self.variables.extend(
            variables
                .into_iter()
                .map(|(name, value)| (name.into(), Value::from(value))),
        );
        self
    }

    /// Renders plain `{role, content}` messages.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, TokenizerError> {
        let messages = Value::from(
            messages
                .iter()
                .map(ChatMessage::to_value)
                .collect::<Vec<_>>(),
        );
        self.render_values(messages, None, None, add_generation_prompt, None)
    }

    /// Renders a conversation given as JSON.
    pub fn render_request(&self, request: &ChatRequest) -> Result<String, TokenizerError> {
        let parse = |text: &str| pyjson::parse_json(text).map_err(TokenizerError::TemplateInput);
        let mut messages = parse(request.messages)?;
        let tools = request.tools.map(parse).transpose()?;
        let documents = request.documents.map(parse).transpose()?;
        let variables = request.variables.map(parse).transpose()?;
        let continued = match request.continue_final_message {
            true => {
                let (tagged, text) = self.tag_final_message(&messages)?;
                messages = tagged;
                Some(text)
            }
            false => None,
        };
        let rendered = self.render_values(
            messages,
            tools,
            documents,
            request.add_generation_prompt,
            variables,
        )?;
        match continued {
            Some(text) => cut_at_continue_tag(rendered, &text),
            None => Ok(rendered),
        }
    }

    /// `messages` with [`CONTINUE_TAG`] after the final message's text (its
    /// `content`, or the last text part of a list of parts), and that text,
    /// as transformers' `render_jinja_template` does it.
    fn tag_final_message(&self, messages: &Value) -> Result<(Value, String), TokenizerError> {
        let refuse = |why: &str| Err(TokenizerError::ContinueFinalMessage(why.into()));
        let source = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(TokenizerError::TemplateRender)?
            .source()
            .to_owned();
        if !source.contains("content") {
            return refuse("the chat template reads no message `content` to continue");
        }
        let mut list: Vec<Value> = messages
            .try_iter()
            .map_err(TokenizerError::TemplateRender)?
            .collect();
        let Some(last) = list.pop() else {
            return refuse("the conversation is empty");
        };
        let content = last.get_attr("content").unwrap_or_default();
        let (tagged, text) = if let Some(text) = content.as_str() {
            (
                Value::from(format!("{text}{CONTINUE_TAG}")),
                text.to_owned(),
            )
        } else if content.kind() == ValueKind::Seq {
            let mut parts: Vec<Value> = content
                .try_iter()
                .map_err(TokenizerError::TemplateRender)?
                .collect();
            let Some(at) = parts
                .iter()
                .rposition(|p| p.get_attr("text").is_ok_and(|t| !t.is_undefined()))
            else {
                return refuse("the final message has no text part to continue");
            };
            let text = parts[at].get_attr("text").unwrap_or_default().to_string();
            parts[at] = with_entry(
                &parts[at],
                "text",
                Value::from(format!("{text}{CONTINUE_TAG}")),
            )?;
            (Value::from(parts), text)
        } else {
            return refuse("the final message has no \"content\" to continue");
        };
        list.push(with_entry(&last, "content", tagged)?);
        Ok((Value::from(list), text))
    }

    fn render_values(
        &self,
        messages: Value,
        tools: Option<Value>,
        documents: Option<Value>,
        add_generation_prompt: bool,
        variables: Option<Value>,
    ) -> Result<String, TokenizerError> {
        let mut context: BTreeMap<String, Value> = self.variables.iter().cloned().collect();
        if let Some(variables) = variables {
            let names = variables
                .try_iter()
                .map_err(TokenizerError::TemplateRender)?;
            for name in names {
                let value = variables
                    .get_item(&name)
                    .map_err(TokenizerError::TemplateRender)?;
                context.insert(name.to_string(), value);
            }
        }
        context.insert("messages".into(), messages);
        context.insert("tools".into(), tools.unwrap_or(Value::from(())));
        context.insert("documents".into(), documents.unwrap_or(Value::from(())));
        context.insert(
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        );
        self.env
            .get_template(TEMPLATE_NAME)
            .and_then(|template| template.render(Value::from(context)))
            .map_err(TokenizerError::TemplateRender)
    }
}

/// A copy of the map `map` (in its key order) with `key` set to `value`.
fn with_entry(map: &Value, key: &str, value: Value) -> Result<Value, TokenizerError> {
    let mut copy = OrderedMap::default();
    for name in map.try_iter().map_err(TokenizerError::TemplateRender)? {
        let entry = map
            .get_item(&name)
            .map_err(TokenizerError::TemplateRender)?;
        copy.insert(name, entry);
    }
    copy.insert(Value::from(key), value);
    Ok(copy.into_value())
}

/// The rendering cut where the continued message's `text` ends, found by
/// [`CONTINUE_TAG`] after it: before the tag, or, where the template
/// trimmed the space after the tag, before it with trailing space trimmed
/// (transformers' rule).
fn cut_at_continue_tag(rendered: String, text: &str) -> Result<String, TokenizerError> {
    let tag = CONTINUE_TAG.trim_end();
    let (Some(at), true) = (rendered.rfind(tag), rendered.contains(text.trim())) else {
        return Err(TokenizerError::ContinueFinalMessage(
            "the final message does not appear in the chat after applying the chat template".into(),
        ));
    };
    Ok(match rendered[at..].starts_with(CONTINUE_TAG) {
        true => rendered[..at].to_owned(),
        false => rendered[..at].trim_end().to_owned(),
    })
}

/// The `raise_exception(message)` global: fails the rendering with `message`.
fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(ErrorKind::InvalidOperation, message))
}

/// The `strftime_now(format)` global, in UTC.
fn strftime_now(format: String) -> String {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    strftime(&format, now)
}

/// Formats a Unix time (UTC) with C `strftime` directives, including glibc's
/// `-` flag for no padding (`%-d`). Unknown directives are kept as written.
fn strftime(format: &str, unix_seconds: i64) -> String {
    const DAYS: [&str; 7] = [
        "Sunday",
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
    ];
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let days = unix_seconds.div_euclid(86_400);
    let seconds = unix_seconds.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let weekday = (days + 4).rem_euclid(7) as usize;
    let day_of_year = days - days_from_civil(year, 1, 1) + 1;
    let (hour, minute, second) = (seconds / 3600, seconds / 60 % 60, seconds % 60);
    let hour12 = if hour % 12 == 0 { 12 } else { hour % 12 };
    let month_name = MONTHS[(month - 1) as usize];

    let mut out = String::new();
    let mut chars = format.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let unpadded = chars.next_if_eq(&'-').is_some();
        let number = |value: i64, width: usize| {
            if unpadded {
                value.to_string()
            } else {
                format!("{value:0width$}")
            }
        };
        let Some(directive) = chars.next() else {
            out.push('%');
            break;
        };
        let text = match directive {
            'Y' => year.to_string(),
            'y' => number(year.rem_euclid(100), 2),
            'm' => number(month, 2),
            'd' => number(day, 2),
            'e' => format!("{day:2}"),
            'H' => number(hour, 2),
            'I' => number(hour12, 2),
            'M' => number(minute, 2),
            'S' => number(second, 2),
            'j' => number(day_of_year, 3),
            'p' => if hour < 12 { "AM" } else { "PM" }.to_owned(),
            'a' => DAYS[weekday][..3].to_owned(),
            'A' => DAYS[weekday].to_owned(),
            'b' | 'h' => month_name[..3].to_owned(),
            'B' => month_name.to_owned(),
            'w' => weekday.to_string(),
            'u' => (if weekday == 0 { 7 } else { weekday }).to_string(),
            'F' => format!("{year}-{month:02}-{day:02}"),
            'T' => format!("{hour:02}:{minute:02}:{second:02}"),
            'R' => format!("{hour:02}:{minute:02}"),
            'D' => format!("{month:02}/{day:02}/{:02}", year.rem_euclid(100)),
            'Z' => "UTC".to_owned(),
            'z' => "+0000".to_owned(),
            'n' => "\n".to_owned(),
            't' => "\t".to_owned(),
            '%' => "%".to_owned(),
            other => format!("%{}{other}", if unpadded { "-" } else { "" }),
        };
        out.push_str(&text);
    }
    out
}

/// (year, month, day) of a day count since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    (yoe + era * 400 + i64::from(month <= 2), month, day)
}

/// The day count since 1970-01-01 of a date (inverse of [`civil_from_days`]).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// Turns transformers' `{% generation %}` ... `{% endgeneration %}` (which
/// only marks assistant tokens) into `{% if true %}` ... `{% endif %}`,
/// keeping whitespace control markers.
fn rewrite_generation_tags(source: &str) -> Cow<'_, str> {
    if !source.contains("generation") {
        return Cow::Borrowed(source);
    }
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(start) = rest.find("{%") {
        let Some(len) = rest[start..].find("%}").map(|end| end + 2) else {
            break;
        };
        let tag = &rest[start..start + len];
        let keyword = tag[2..len - 2].trim_matches(['-', '+']).trim();
        out.push_str(&rest[..start]);
        match keyword {
            "generation" => out.push_str(&tag.replacen("generation", "if true", 1)),
            "endgeneration" => out.push_str(&tag.replacen("endgeneration", "endif", 1)),
            _ => out.push_str(tag),
        }
        rest = &rest[start + len..];
    }
    out.push_str(rest);
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_formats_utc() {
        // 2024-02-29 13:05:09 UTC, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(strftime("%Y-%m-%d %H:%M:%S", t), "2024-02-29 13:05:09");
        assert_eq!(strftime("%d %b %Y", t), "29 Feb 2024");
        assert_eq!(
            strftime("%A %B %-d, %I:%M %p (%j) %Q %%", t),
            "Thursday February 29, 01:05 PM (060) %Q %"
        );
        assert_eq!(strftime("%a %e %y %-m %u %w", 0), "Thu  1 70 1 4 4");
        assert_eq!(
            civil_from_days(days_from_civil(1999, 12, 31)),
            (1999, 12, 31)
        );
    }

    #[test]
    fn generation_tags_become_if_blocks() {
        assert_eq!(
            rewrite_generation_tags("a{%- generation %}b{% endgeneration -%}c{% if x %}"),
            "a{%- if true %}b{% endif -%}c{% if x %}"
        );
    }

    #[test]
    fn template_errors_are_reported() {
        let err = ChatTemplate::new("{% if %}").unwrap_err();
        assert!(matches!(err, TokenizerError::TemplateSyntax(_)), "{err}");

        let template = ChatTemplate::new("{{ raise_exception('no system role') }}").unwrap();
        let err = template.render(&[], false).unwrap_err().to_string();
        assert!(err.contains("no system role"), "{err}");

        let template = ChatTemplate::new("{{ messages | tojson }}").unwrap();
        let request = ChatRequest {
            messages: "[{",
            ..ChatRequest::default()
        };
        assert!(matches!(
            template.render_request(&request),
            Err(TokenizerError::TemplateInput(_))
        ));
    }

    #[test]
    fn renders_python_style() {
        let template = ChatTemplate::new(
            "{% for m in messages %}{{ m.role }}={{ m.content.strip() }};{% endfor %}\
             {{ add_generation_prompt }} {{ tools }} {{ bos_token }}",
        )
        .unwrap()
        .with_variables([("bos_token", "<s>".to_owned())]);
        let rendered = template
            .render(&[ChatMessage::new("user", "  hi  ")], true)
            .unwrap();
        assert_eq!(rendered, "user=hi;True None <s>");
    }
}
