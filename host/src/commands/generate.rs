//! `host generate`: one prompt in, tokens streamed out.

use std::io::Write;
use std::time::Instant;

use anyhow::{bail, Context};
use serde::Serialize;

use crate::cli::{GenerateArgs, OutputFormat};
use crate::compiler::CompileOutcome;
use crate::engine::defaults::generation_defaults;
use crate::engine::{npy, Generator, Sampler, SamplingParams};
use crate::tokenizer::ChatMessage;

#[derive(Serialize)]
struct JsonOutput {
    prompt_ids: Vec<u32>,
    generated_ids: Vec<u32>,
    text: String,
}

/// Loads the model and generates.
pub fn generate(args: &GenerateArgs) -> anyhow::Result<()> {
    let json = args.output == OutputFormat::Json;
    let started = Instant::now();
    let model = super::load_model(&args.load)?;
    let compile = match model.compile {
        CompileOutcome::Compiled(t) => format!("compiled in {:.0} ms", t.as_secs_f64() * 1e3),
        CompileOutcome::Cached(t) => format!("compile cache hit, {:.0} ms", t.as_secs_f64() * 1e3),
    };
    tracing::info!(
        "loaded {} ({}) in {:.2} s; {compile}",
        model.resolved.name,
        model.architecture.info.name,
        started.elapsed().as_secs_f64()
    );

    let prompt_ids: Vec<u32> = match (&args.prompt, &args.prompt_ids) {
        (_, Some(ids)) => ids.clone(),
        (Some(text), None) => {
            let tokenizer = model
                .tokenizer
                .as_ref()
                .context("the model has no tokenizer; pass --prompt-ids")?;
            if args.chat {
                let template = tokenizer
                    .chat_template()?
                    .context("the model has no chat template; drop --chat")?;
                let mut messages = Vec::new();
                if let Some(system) = &args.system {
                    messages.push(ChatMessage::new("system", system.as_str()));
                }
                messages.push(ChatMessage::new("user", text.as_str()));
                let rendered = template.render(&messages, true)?;
                tokenizer.encode(&rendered, false)?
            } else {
                tokenizer.encode(text, true)?
            }
        }
        (None, None) => bail!("give --prompt or --prompt-ids"),
    };
    if prompt_ids.is_empty() {
        bail!("the prompt is empty");
    }
    let vocab = model
        .hf_config
        .get("vocab_size")
        .and_then(|v| v.as_u64())
        .unwrap_or(u64::MAX);
    if let Some(bad) = prompt_ids.iter().find(|&&id| u64::from(id) >= vocab) {
        bail!("prompt token id {bad} is outside the vocabulary of {vocab}");
    }
    let max_seq_len = model.config.max_seq_len as usize;
    let max_new = args
        .max_new_tokens
        .min(max_seq_len.saturating_sub(prompt_ids.len()));
    if max_new == 0 && prompt_ids.len() >= max_seq_len {
        bail!(
            "the prompt ({} tokens) fills the context of {max_seq_len} tokens",
            prompt_ids.len()
        );
    }

    let defaults = generation_defaults(&model);
    let sampling = SamplingParams {
        temperature: args.temperature.unwrap_or(defaults.sampling.temperature),
        top_k: args.top_k.unwrap_or(defaults.sampling.top_k),
        top_p: args.top_p.unwrap_or(defaults.sampling.top_p),
        min_p: args.min_p.unwrap_or(defaults.sampling.min_p),
        seed: args.seed,
    };
    sampling.validate().map_err(anyhow::Error::msg)?;
    let mut sampler = Sampler::new(sampling);

    let prompt_len = prompt_ids.len();
    let mut generator = Generator::new(&model, prompt_len + max_new.max(1))?;
    let prefill_started = Instant::now();
    let mut logits = generator.feed(&prompt_ids, args.dump_logits.is_some())?;
    let prefill_time = prefill_started.elapsed();
    if let Some(path) = &args.dump_logits {
        let vocab = logits[0].len();
        let flat: Vec<f32> = logits.iter().flatten().copied().collect();
        npy::write_f32(path, &[logits.len(), vocab], &flat)
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    let mut next_logits = logits.pop().expect("the last row");

    let stream_text = !json && model.tokenizer.is_some();
    let mut stream = model.tokenizer.as_ref().map(|t| t.decode_stream(true));
    let mut stdout = std::io::stdout().lock();
    let mut generated = Vec::new();
    let decode_started = Instant::now();
    for _ in 0..max_new {
        let token = sampler.sample(&next_logits);
        generated.push(token);
        if stream_text {
            if let Some(delta) = stream.as_mut().and_then(|s| s.step(token).transpose()) {
                write!(stdout, "{}", delta?)?;
                stdout.flush()?;
            }
        }
        if defaults.eos_token_ids.contains(&token) || generated.len() == max_new {
            break;
        }
        next_logits = generator.feed(&[token], false)?.pop().expect("one row");
    }
    let decode_time = decode_started.elapsed();
    if stream_text {
        if let Some(rest) = stream.as_mut().and_then(|s| s.flush().transpose()) {
            write!(stdout, "{}", rest?)?;
        }
        writeln!(stdout)?;
    }
    if json {
        let text = match &model.tokenizer {
            Some(t) => t.decode(&generated, true)?,
            None => String::new(),
        };
        serde_json::to_writer(
            &mut stdout,
            &JsonOutput {
                prompt_ids,
                generated_ids: generated.clone(),
                text,
            },
        )?;
        writeln!(stdout)?;
    } else if model.tokenizer.is_none() {
        let ids: Vec<String> = generated.iter().map(ToString::to_string).collect();
        writeln!(stdout, "{}", ids.join(","))?;
    }
    let decode_steps = generated.len().saturating_sub(1);
    tracing::info!(
        "prefill {prompt_len} tokens in {:.0} ms ({:.1} tok/s); decode {decode_steps} steps in {:.0} ms ({:.1} tok/s)",
        prefill_time.as_secs_f64() * 1e3,
        prompt_len as f64 / prefill_time.as_secs_f64().max(1e-9),
        decode_time.as_secs_f64() * 1e3,
        decode_steps as f64 / decode_time.as_secs_f64().max(1e-9),
    );
    Ok(())
}
