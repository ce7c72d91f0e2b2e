//! Tokenizers and chat templates against transformers.
//!
//! The golden data comes from `tests/fixtures/tokenizer/generate.py`
//! (transformers loading each tokenizer from a GGUF file). Synthetic tiny
//! vocabularies and the real chat templates are always tested. The real
//! models' vocabularies are too big to commit: the generator extracts them
//! from the GGUF files into a directory (`<name>.json`, `<name>-hf/`) that
//! `KILN_TOKENIZER_FIXTURES` names; without it those tests are skipped.

use std::fs;
use std::path::{Path, PathBuf};

use kiln_host::tokenizer::{
    tokenizer_from_gguf, ChatMessage, ChatRequest, ChatTemplate, GgufVocab, Tokenizer,
};
use serde::Deserialize;

const TINY: [&str; 5] = [
    "tiny-gpt2",
    "tiny-qwen2",
    "tiny-llama3",
    "tiny-llama",
    "tiny-gemma",
];
const REAL: [&str; 3] = ["smollm2", "qwen2.5", "gemma3"];
const FIXTURES_ENV: &str = "KILN_TOKENIZER_FIXTURES";

#[derive(Deserialize)]
struct Golden {
    special: Special,
    encodings: Vec<Encoding>,
    chats: Vec<Chat>,
}

#[derive(Deserialize)]
struct Special {
    bos_token: Option<String>,
    eos_token: Option<String>,
    unk_token: Option<String>,
    pad_token: Option<String>,
    add_bos_token: bool,
    add_eos_token: bool,
    vocab_size: usize,
}

#[derive(Deserialize)]
struct Encoding {
    text: String,
    ids: Vec<u32>,
    ids_no_special: Vec<u32>,
    decoded: String,
    decoded_skip_special: String,
}

#[derive(Deserialize)]
struct Chat {
    /// JSON text (as are `tools` and `variables`), so that key order survives.
    messages: String,
    tools: Option<String>,
    #[serde(default)]
    variables: Option<String>,
    add_generation_prompt: bool,
    /// What transformers renders, or `None` when it raises `error`.
    rendered: Option<String>,
    #[serde(default)]
    error: Option<String>,
}

#[derive(Deserialize)]
struct TemplateGolden {
    bos_token: String,
    eos_token: String,
    chats: Vec<Chat>,
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tokenizer")
}

fn read_json<T: for<'de> Deserialize<'de>>(path: &Path) -> T {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The directory of extracted real-model vocabularies. The tests that need
/// it are `#[ignore]`d: run them with `--ignored` and the variable set.
fn real_fixtures() -> PathBuf {
    let dir = std::env::var_os(FIXTURES_ENV).unwrap_or_else(|| {
        panic!("set {FIXTURES_ENV} to the directory generate.py extracted the real vocabularies to (e.g. /work/models/tokenizers)")
    });
    PathBuf::from(dir)
}

/// Every difference between the tokenizer and the golden data, one line each.
fn encoding_mismatches(name: &str, tokenizer: &Tokenizer, golden: &Golden) -> Vec<String> {
    let mut problems = Vec::new();
    let mut check = |what: &str, text: &str, got: String, want: String| {
        if got != want {
            problems.push(format!(
                "{name} {what} {text:?}:\n   got {got}\n  want {want}"
            ));
        }
    };
    for case in &golden.encodings {
        let text = case.text.as_str();
        let ids = tokenizer.encode(text, true).unwrap();
        check("ids", text, format!("{ids:?}"), format!("{:?}", case.ids));
        let plain = tokenizer.encode(text, false).unwrap();
        check(
            "ids without special tokens",
            text,
            format!("{plain:?}"),
            format!("{:?}", case.ids_no_special),
        );
        let decoded = tokenizer.decode(&case.ids, false).unwrap();
        check(
            "decode",
            text,
            format!("{decoded:?}"),
            format!("{:?}", case.decoded),
        );
        let skipped = tokenizer.decode(&case.ids, true).unwrap();
        check(
            "decode skipping special tokens",
            text,
            format!("{skipped:?}"),
            format!("{:?}", case.decoded_skip_special),
        );
        for skip in [false, true] {
            let streamed = stream(tokenizer, &case.ids, skip);
            let whole = tokenizer.decode(&case.ids, skip).unwrap();
            check(
                &format!("stream (skip special {skip})"),
                text,
                format!("{streamed:?}"),
                format!("{whole:?}"),
            );
        }
    }
    problems
}

/// Decodes ids one at a time, checking that no delta is an incomplete character.
fn stream(tokenizer: &Tokenizer, ids: &[u32], skip_special_tokens: bool) -> String {
    let mut stream = tokenizer.decode_stream(skip_special_tokens);
    let mut text = String::new();
    for &id in ids {
        if let Some(delta) = stream.step(id).unwrap() {
            assert!(
                !delta.ends_with('\u{fffd}'),
                "delta {delta:?} ends in a partial character"
            );
            text.push_str(&delta);
        }
    }
    text.push_str(&stream.flush().unwrap().unwrap_or_default());
    text
}

fn special_mismatches(name: &str, tokenizer: &Tokenizer, want: &Special) -> Vec<String> {
    let special = tokenizer.special_tokens();
    let content =
        |t: &Option<kiln_host::tokenizer::SpecialToken>| t.as_ref().map(|t| t.content.clone());
    let got = (
        content(&special.bos),
        content(&special.eos),
        content(&special.unk),
        content(&special.pad),
        special.add_bos,
        special.add_eos,
        tokenizer.vocab_size(),
    );
    let expected = (
        want.bos_token.clone(),
        want.eos_token.clone(),
        want.unk_token.clone(),
        want.pad_token.clone(),
        want.add_bos_token,
        want.add_eos_token,
        want.vocab_size,
    );
    if got == expected {
        Vec::new()
    } else {
        vec![format!(
            "{name} special tokens:\n   got {got:?}\n  want {expected:?}"
        )]
    }
}

fn chat_mismatches(name: &str, template: &ChatTemplate, chats: &[Chat]) -> Vec<String> {
    chats
        .iter()
        .filter_map(|chat| {
            let request = ChatRequest {
                messages: &chat.messages,
                tools: chat.tools.as_deref(),
                variables: chat.variables.as_deref(),
                add_generation_prompt: chat.add_generation_prompt,
                ..ChatRequest::default()
            };
            let got = template.render_request(&request);
            let matches = match (&got, &chat.rendered, &chat.error) {
                (Ok(rendered), Some(want), _) => rendered == want,
                (Err(error), None, Some(want)) => error.to_string().contains(want.as_str()),
                _ => false,
            };
            (!matches).then(|| {
                format!(
                    "{name} chat {} (generation prompt {}):\n   got {got:?}\n  want {:?} {:?}",
                    chat.messages, chat.add_generation_prompt, chat.rendered, chat.error
                )
            })
        })
        .collect()
}

fn assert_none(problems: Vec<String>) {
    assert!(
        problems.is_empty(),
        "{} mismatches:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn tiny_gguf_vocabularies_match_transformers() {
    let mut problems = Vec::new();
    for name in TINY {
        let dir = fixtures().join(name);
        let vocab: GgufVocab = read_json(&dir.join("vocab.json"));
        let golden: Golden = read_json(&dir.join("golden.json"));
        let tokenizer = tokenizer_from_gguf(&vocab).unwrap_or_else(|e| panic!("{name}: {e}"));
        problems.extend(special_mismatches(name, &tokenizer, &golden.special));
        problems.extend(encoding_mismatches(name, &tokenizer, &golden));
        assert_eq!(
            tokenizer.chat_template_source(),
            vocab.chat_template.as_deref()
        );
    }
    assert_none(problems);
}

#[test]
fn tiny_tokenizer_json_matches_transformers() {
    let mut problems = Vec::new();
    for name in TINY {
        let dir = fixtures().join(name);
        let golden: Golden = read_json(&dir.join("golden.json"));
        let tokenizer = Tokenizer::from_file(dir.join("hf/tokenizer.json"))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        problems.extend(special_mismatches(name, &tokenizer, &golden.special));
        problems.extend(encoding_mismatches(name, &tokenizer, &golden));
        let vocab: GgufVocab = read_json(&dir.join("vocab.json"));
        assert_eq!(
            tokenizer.chat_template_source(),
            vocab.chat_template.as_deref(),
            "{name}"
        );
    }
    assert_none(problems);
}

#[test]
fn real_chat_templates_match_transformers() {
    let mut problems = Vec::new();
    for name in ["smollm2", "qwen2.5"] {
        let dir = fixtures().join(name);
        let golden: Golden = read_json(&dir.join("golden.json"));
        let source = fs::read_to_string(dir.join("chat_template.jinja")).unwrap();
        let variables = [
            ("bos_token", &golden.special.bos_token),
            ("eos_token", &golden.special.eos_token),
            ("unk_token", &golden.special.unk_token),
            ("pad_token", &golden.special.pad_token),
        ]
        .into_iter()
        .filter_map(|(name, value)| value.clone().map(|v| (name, v)));
        let template = ChatTemplate::new(&source)
            .unwrap()
            .with_variables(variables);
        assert!(!golden.chats.is_empty(), "{name} has no chat goldens");
        problems.extend(chat_mismatches(name, &template, &golden.chats));
    }
    assert_none(problems);
}

#[test]
fn template_features_match_transformers() {
    let dir = fixtures().join("templates");
    let mut problems = Vec::new();
    for name in ["features", "turns"] {
        let golden: TemplateGolden = read_json(&dir.join(format!("{name}.json")));
        let source = fs::read_to_string(dir.join(format!("{name}.jinja"))).unwrap();
        let template = ChatTemplate::new(&source).unwrap().with_variables([
            ("bos_token", golden.bos_token),
            ("eos_token", golden.eos_token),
        ]);
        problems.extend(chat_mismatches(name, &template, &golden.chats));
    }
    assert_none(problems);
}

/// A `continue_final_message` rendering of one of the committed templates.
#[derive(Deserialize)]
struct ContinuedChat {
    template: String,
    #[serde(flatten)]
    chat: Chat,
}

#[derive(Deserialize)]
struct ContinuedGolden {
    bos_token: String,
    eos_token: String,
    chats: Vec<ContinuedChat>,
}

/// `continue_final_message`: the rendering ends where the final message's
/// text does (a plain message, spaces the template trims, the last text
/// part of a list, a user message), as transformers' renderer cuts it; a
/// final message without content is refused, as is what the template
/// itself refuses.
#[test]
fn continued_final_messages_match_transformers() {
    let golden: ContinuedGolden = read_json(&fixtures().join("templates/continue_final.json"));
    let mut problems = Vec::new();
    for case in &golden.chats {
        let path = match case.template.as_str() {
            "features" | "turns" => format!("templates/{}.jinja", case.template),
            real => format!("{real}/chat_template.jinja"),
        };
        let source = fs::read_to_string(fixtures().join(path)).unwrap();
        let template = ChatTemplate::new(&source).unwrap().with_variables([
            ("bos_token", golden.bos_token.clone()),
            ("eos_token", golden.eos_token.clone()),
        ]);
        let chat = &case.chat;
        let request = ChatRequest {
            messages: &chat.messages,
            variables: chat.variables.as_deref(),
            continue_final_message: true,
            ..ChatRequest::default()
        };
        let got = template.render_request(&request);
        let matches = match (&got, &chat.rendered, &chat.error) {
            (Ok(rendered), Some(want), _) => rendered == want,
            (Err(error), None, Some(want)) if want.contains("no \"content\"") => {
                error.to_string().contains("no \"content\"")
            }
            // The template's own failure, in Python's words or minijinja's.
            (Err(_), None, Some(_)) => true,
            _ => false,
        };
        if !matches {
            problems.push(format!(
                "{} {}:\n   got {got:?}\n  want {:?} {:?}",
                case.template, chat.messages, chat.rendered, chat.error
            ));
        }
    }
    assert_eq!(golden.chats.len(), 20);
    assert_none(problems);
}

#[test]
fn plain_messages_render() {
    let source = fs::read_to_string(fixtures().join("smollm2/chat_template.jinja")).unwrap();
    let template = ChatTemplate::new(&source).unwrap();
    let rendered = template
        .render(&[ChatMessage::new("user", "Hi")], true)
        .unwrap();
    assert_eq!(
        rendered,
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
         <|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    );
}

#[test]
fn decode_stream_holds_back_partial_characters() {
    let dir = fixtures().join("tiny-gpt2");
    let vocab: GgufVocab = read_json(&dir.join("vocab.json"));
    let tokenizer = tokenizer_from_gguf(&vocab).unwrap();
    // "😀" is four byte tokens in this vocabulary: nothing comes out before the last.
    let ids = tokenizer.encode("a😀", false).unwrap();
    assert_eq!(ids.len(), 5, "{ids:?}");
    let mut stream = tokenizer.decode_stream(false);
    let deltas: Vec<Option<String>> = ids.iter().map(|&id| stream.step(id).unwrap()).collect();
    assert_eq!(
        deltas,
        [Some("a".into()), None, None, None, Some("😀".into())]
    );
    // An unfinished character comes out as U+FFFD at the end.
    assert_eq!(stream.step(ids[1]).unwrap(), None);
    assert_eq!(stream.flush().unwrap().as_deref(), Some("\u{fffd}"));
    assert_eq!(stream.flush().unwrap(), None);
}

#[test]
fn decode_stream_passes_over_skipped_special_tokens() {
    let dir = fixtures().join("tiny-gpt2");
    let vocab: GgufVocab = read_json(&dir.join("vocab.json"));
    let tokenizer = tokenizer_from_gguf(&vocab).unwrap();
    let special = (0..tokenizer.vocab_size() as u32)
        .find(|&id| tokenizer.skips_when_decoding(id))
        .expect("a special token");
    assert!(!tokenizer.decode(&[special], false).unwrap().is_empty());
    // Specials between the byte tokens of one character, and a long run of
    // them: the deltas still make up exactly the whole decode.
    let text = tokenizer.encode("a😀b", false).unwrap();
    let mut ids = vec![text[0], text[1], special, text[2], special];
    ids.extend(&text[3..]);
    ids.extend(std::iter::repeat_n(special, 500));
    ids.push(text[0]);
    for skip in [true, false] {
        let whole = tokenizer.decode(&ids, skip).unwrap();
        assert_eq!(stream(&tokenizer, &ids, skip), whole, "skip special {skip}");
    }
    let mut stream = tokenizer.decode_stream(true);
    assert_eq!(stream.step(special).unwrap(), None);
    assert_eq!(
        stream.flush().unwrap(),
        None,
        "nothing held for a skipped token"
    );
}

/// The ids the detokenizer passes over are exactly those `decode` leaves
/// out when it skips special tokens, in every tiny tokenizer (Qwen2's added
/// `<tool_call>` is not special, and stays).
#[test]
fn skipped_ids_are_those_decode_skips() {
    for name in TINY {
        let dir = fixtures().join(name);
        let tokenizer = Tokenizer::from_file(dir.join("hf/tokenizer.json"))
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut skipped = 0;
        for id in 0..tokenizer.vocab_size() as u32 {
            let kept = tokenizer.decode(&[id], false).unwrap();
            let decode_skips = tokenizer.decode(&[id], true).unwrap() != kept;
            assert_eq!(
                tokenizer.skips_when_decoding(id),
                decode_skips,
                "{name}: id {id} ({kept:?})"
            );
            skipped += usize::from(decode_skips);
        }
        assert!(skipped > 0, "{name}: no special token");
    }
}

#[test]
fn missing_files_are_reported() {
    let err = Tokenizer::from_file("/nonexistent/tokenizer.json")
        .unwrap_err()
        .to_string();
    assert!(err.contains("/nonexistent/tokenizer.json"), "{err}");
}

#[test]
#[ignore = "developer-run: needs KILN_TOKENIZER_FIXTURES (host/tests/fixtures/tokenizer/generate.py)"]
fn real_gguf_vocabularies_match_transformers() {
    let dir = real_fixtures();
    let mut problems = Vec::new();
    for name in REAL {
        let path = dir.join(format!("{name}.json"));
        if !path.exists() {
            eprintln!("skipped {name}: {} is missing", path.display());
            continue;
        }
        let golden: Golden = read_json(&fixtures().join(name).join("golden.json"));
        let vocab: GgufVocab = read_json(&path);
        let tokenizer = tokenizer_from_gguf(&vocab).unwrap_or_else(|e| panic!("{name}: {e}"));
        let before = problems.len();
        problems.extend(special_mismatches(name, &tokenizer, &golden.special));
        problems.extend(encoding_mismatches(name, &tokenizer, &golden));
        eprintln!(
            "{name}: {} strings, {} mismatching checks",
            golden.encodings.len(),
            problems.len() - before
        );
        let committed = fs::read_to_string(fixtures().join(name).join("chat_template.jinja")).ok();
        assert_eq!(
            vocab.chat_template, committed,
            "{name}: committed template differs from the GGUF's"
        );
        if let Some(template) = tokenizer.chat_template().unwrap() {
            problems.extend(chat_mismatches(name, &template, &golden.chats));
        }
    }
    assert_none(problems);
}

#[test]
#[ignore = "developer-run: needs KILN_TOKENIZER_FIXTURES (host/tests/fixtures/tokenizer/generate.py)"]
fn real_tokenizer_json_matches_transformers() {
    let dir = real_fixtures();
    let mut problems = Vec::new();
    for name in REAL {
        let path = dir.join(format!("{name}-hf/tokenizer.json"));
        if !path.exists() {
            eprintln!("skipped {name}: {} is missing", path.display());
            continue;
        }
        let golden: Golden = read_json(&fixtures().join(name).join("golden.json"));
        let tokenizer = Tokenizer::from_file(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        problems.extend(special_mismatches(name, &tokenizer, &golden.special));
        problems.extend(encoding_mismatches(name, &tokenizer, &golden));
        if let Some(template) = tokenizer.chat_template().unwrap() {
            problems.extend(chat_mismatches(name, &template, &golden.chats));
        }
    }
    assert_none(problems);
}
