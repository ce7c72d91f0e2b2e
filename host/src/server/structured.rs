//! The request fields that ask for structured output, read into one
//! [`Grammar`]: OpenAI's `response_format` (`json_object`, `json_schema`)
//! and vLLM's `structured_outputs` (`json`, `regex`, `choice`, `grammar`,
//! `json_object`) with their older `guided_*` spellings. A request may ask
//! in one way only; anything malformed is a 400 naming the field.

use std::sync::Arc;

use llguidance::Matcher;
use serde_json::Value;

use super::openai::{ApiError, SamplingFields};
use super::AppState;
use crate::engine::structured::Grammar;

/// The matcher for the grammar `fields` ask for, compiled on the blocking
/// pool; an invalid schema, regex or grammar is a 400.
pub async fn constraint(
    state: &Arc<AppState>,
    fields: &SamplingFields,
) -> Result<Option<Matcher>, ApiError> {
    match requested_grammar(fields)? {
        Some(grammar) => compile(state, grammar).await.map(Some),
        None => Ok(None),
    }
}

/// `grammar`'s matcher, compiled on the blocking pool; a grammar
/// llguidance refuses is a 400.
pub async fn compile(state: &Arc<AppState>, grammar: Grammar) -> Result<Matcher, ApiError> {
    let state = state.clone();
    super::prompt::off_the_async_threads(move || {
        state
            .grammars
            .matcher(&grammar)
            .map_err(|e| ApiError::invalid(format!("structured output: {e}"), None))
    })
    .await
}

/// The grammar a request asks for, if any.
pub fn requested_grammar(fields: &SamplingFields) -> Result<Option<Grammar>, ApiError> {
    let mut asked = Vec::new();
    if let Some(format) = &fields.response_format {
        if let Some(grammar) = response_format(format)? {
            asked.push(("response_format", grammar));
        }
    }
    if let Some(outputs) = &fields.structured_outputs {
        asked.push(("structured_outputs", structured_outputs(outputs)?));
    }
    for (name, value) in [
        ("guided_json", &fields.guided_json),
        ("guided_regex", &fields.guided_regex),
        ("guided_choice", &fields.guided_choice),
        ("guided_grammar", &fields.guided_grammar),
    ] {
        if let Some(value) = value {
            let kind = name.trim_start_matches("guided_");
            asked.push((name, one_kind(kind, value, name)?));
        }
    }
    match asked.len() {
        0 => Ok(None),
        1 => Ok(asked.pop().map(|(_, g)| g)),
        _ => Err(ApiError::invalid(
            format!(
                "ask for structured output in one way only, not with {}",
                asked
                    .iter()
                    .map(|(n, _)| *n)
                    .collect::<Vec<_>>()
                    .join(" and ")
            ),
            Some(asked[1].0),
        )),
    }
}

/// OpenAI's `response_format`.
fn response_format(format: &Value) -> Result<Option<Grammar>, ApiError> {
    let invalid = |message: String| ApiError::invalid(message, Some("response_format"));
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(None),
        Some("json_object") => Ok(Some(Grammar::json_object())),
        Some("json_schema") => {
            let spec = format.get("json_schema").ok_or_else(|| {
                invalid("response_format of type json_schema needs `json_schema`".into())
            })?;
            if let Some(strict) = spec
                .get("strict")
                .filter(|s| !s.is_boolean() && !s.is_null())
            {
                return Err(invalid(format!(
                    "response_format.json_schema.strict must be a boolean, got {strict}"
                )));
            }
            // Strict or not, the output is held to the schema.
            match spec.get("schema") {
                Some(schema) if schema.is_object() => Ok(Some(Grammar::JsonSchema(schema.clone()))),
                _ => Err(invalid(
                    "response_format.json_schema.schema must be a JSON schema object".into(),
                )),
            }
        }
        Some(other) => Err(invalid(format!(
            "response_format type `{other}` is not supported (text, json_object, json_schema)"
        ))),
        None => Err(invalid("response_format needs a `type`".into())),
    }
}

/// vLLM's `structured_outputs`: exactly one of its kinds.
fn structured_outputs(outputs: &Value) -> Result<Grammar, ApiError> {
    let param = "structured_outputs";
    let Some(fields) = outputs.as_object() else {
        return Err(ApiError::invalid(
            "structured_outputs must be an object",
            Some(param),
        ));
    };
    let set: Vec<(&String, &Value)> = fields.iter().filter(|(_, v)| !v.is_null()).collect();
    match set.as_slice() {
        [(kind, value)] => one_kind(kind, value, param),
        [] => Err(ApiError::invalid(
            "structured_outputs sets none of json, regex, choice, grammar, json_object",
            Some(param),
        )),
        _ => Err(ApiError::invalid(
            format!(
                "structured_outputs sets {}: give exactly one",
                set.iter()
                    .map(|(k, _)| k.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            Some(param),
        )),
    }
}

/// One kind of grammar and its value.
fn one_kind(kind: &str, value: &Value, param: &str) -> Result<Grammar, ApiError> {
    let invalid = |message: String| ApiError::invalid(message, Some(param));
    match (kind, value) {
        ("json", Value::Object(_)) => Ok(Grammar::JsonSchema(value.clone())),
        ("json", Value::String(text)) => serde_json::from_str::<Value>(text)
            .ok()
            .filter(Value::is_object)
            .map(Grammar::JsonSchema)
            .ok_or_else(|| invalid(format!("{param}: `json` is not a JSON schema object"))),
        ("json_object", Value::Bool(true)) => Ok(Grammar::json_object()),
        ("regex", Value::String(regex)) => Ok(Grammar::Regex(regex.clone())),
        ("grammar", Value::String(lark)) => Ok(Grammar::Lark(lark.clone())),
        ("choice", Value::Array(choices)) if !choices.is_empty() => choices
            .iter()
            .map(|c| c.as_str().map(str::to_owned))
            .collect::<Option<Vec<_>>>()
            .map(Grammar::Choice)
            .ok_or_else(|| invalid(format!("{param}: every `choice` must be a string"))),
        ("json" | "json_object" | "regex" | "grammar" | "choice", _) => Err(invalid(format!(
            "{param}: `{kind}` has the wrong type ({value})"
        ))),
        _ => Err(invalid(format!(
            "{param}: `{kind}` is not supported (json, regex, choice, grammar, json_object)"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn grammar(extra: Value) -> Result<Option<Grammar>, ApiError> {
        let mut body = json!({"model": "m"});
        body.as_object_mut()
            .unwrap()
            .extend(extra.as_object().unwrap().clone());
        requested_grammar(&serde_json::from_value(body).unwrap())
    }

    #[test]
    fn each_way_of_asking_reads_into_one_grammar() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let cases = [
            (json!({}), None),
            (json!({"response_format": {"type": "text"}}), None),
            (
                json!({"response_format": {"type": "json_object"}}),
                Some(Grammar::json_object()),
            ),
            (
                json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": true}}}),
                Some(Grammar::JsonSchema(schema.clone())),
            ),
            (
                json!({"structured_outputs": {"json": schema.to_string()}}),
                Some(Grammar::JsonSchema(schema.clone())),
            ),
            (
                json!({"structured_outputs": {"choice": ["yes", "no"]}}),
                Some(Grammar::Choice(vec!["yes".into(), "no".into()])),
            ),
            (
                json!({"guided_regex": "[0-9]+"}),
                Some(Grammar::Regex("[0-9]+".into())),
            ),
            (
                json!({"structured_outputs": {"grammar": "start: \"a\""}}),
                Some(Grammar::Lark("start: \"a\"".into())),
            ),
        ];
        for (body, want) in cases {
            assert_eq!(grammar(body.clone()).unwrap(), want, "{body}");
        }
    }

    #[test]
    fn malformed_or_double_requests_are_refused_by_name() {
        for (body, param) in [
            (
                json!({"response_format": {"type": "xml"}}),
                "response_format",
            ),
            (
                json!({"response_format": {"type": "json_schema"}}),
                "response_format",
            ),
            (
                json!({"structured_outputs": {"regex": "a", "choice": ["b"]}}),
                "structured_outputs",
            ),
            (
                json!({"structured_outputs": {"choice": [1]}}),
                "structured_outputs",
            ),
            (
                json!({"structured_outputs": {"backend": "x"}}),
                "structured_outputs",
            ),
            (
                json!({"response_format": {"type": "json_object"}, "guided_regex": "a"}),
                "guided_regex",
            ),
        ] {
            let error = grammar(body.clone()).unwrap_err();
            assert_eq!(
                error.param.as_deref(),
                Some(param),
                "{body}: {}",
                error.message
            );
        }
    }
}
