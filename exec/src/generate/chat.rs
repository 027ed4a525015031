//! The model's chat template (`tokenizer.chat_template`, Jinja) for the two forms this
//! tool renders:
//! * ChatML, `<|im_start|>{role}\n{content}<|im_end|>\n` per message then
//!   `<|im_start|>assistant\n`, optionally with a default system message when the first
//!   message is not one (SmolLM2's template): its text, without whitespace and with the
//!   default system message cut out, must be the ChatML loop;
//! * Gemma's turns, `<start_of_turn>{role}\n{content}<end_of_turn>\n` with the
//!   assistant's role called `model`, then `<start_of_turn>model\n` (Gemma 2 and 3
//!   instruction-tuned): its text must hold each of [`GEMMA_PARTS`].
//!
//! The template is recognised, not interpreted; anything else is refused with the
//! template's beginning in the error.

use super::error::GenerateError;

/// The ChatML loop and generation prompt, whitespace and Jinja's `-` trim marks removed.
const CHATML: &str = "{%formessageinmessages%}{{'<|im_start|>'+message['role']+'\n'+message['content']+'<|im_end|>'+'\n'}}{%endfor%}{%ifadd_generation_prompt%}{{'<|im_start|>assistant\n'}}{%endif%}";

/// SmolLM2's default-system block (with its message cut out as `SYSTEM`), inserted after
/// the loop's opening.
const DEFAULT_SYSTEM: &str = "{%ifloop.firstandmessages[0]['role']!='system'%}{{'<|im_start|>system\nSYSTEM<|im_end|>\n'}}{%endif%}";

/// What a Gemma template holds, whitespace and trim marks removed and quotes made single:
/// the BOS, the assistant's role renamed `model`, each turn's opening and closing, and the
/// generation prompt.
pub const GEMMA_PARTS: [&str; 5] = [
    "{{bos_token}}",
    "{%setrole='model'%}",
    "{{'<start_of_turn>'+role+'\n'",
    "{{'<end_of_turn>\n'}}",
    "{%ifadd_generation_prompt%}{{'<start_of_turn>model\n'}}{%endif%}",
];

/// Which turn format a template renders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChatForm {
    /// `<|im_start|>role\ncontent<|im_end|>\n` (SmolLM2, Qwen).
    ChatMl,
    /// `<start_of_turn>role\ncontent<end_of_turn>\n`, the assistant as `model` (Gemma);
    /// `trim`: the template trims each message's content.
    Gemma {
        /// Whether the content is trimmed (`| trim`).
        trim: bool,
    },
}

/// A recognised chat template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatTemplate {
    /// The turn format.
    pub form: ChatForm,
    /// The system message the template adds when the conversation starts without one.
    pub default_system: Option<String>,
}

impl ChatTemplate {
    /// Recognises `template` (the `tokenizer.chat_template` text).
    pub fn parse(template: &str) -> Result<Self, GenerateError> {
        // Jinja string literals may spell a newline as the escape `\n`.
        let text = template.replace("\\n", "\n").replace('"', "'");
        if text.contains("<start_of_turn>") {
            return Self::parse_gemma(template, &text);
        }
        let opening = "<|im_start|>system\n";
        let (default_system, text) = match text.find(opening) {
            Some(start) if text[..start].contains("loop.first") => {
                let body = start + opening.len();
                let end = text[body..].find("<|im_end|>").map(|e| body + e);
                let Some(end) = end else {
                    return Err(unrenderable(template, "the system message never ends"));
                };
                let system = text[body..end].to_string();
                (
                    Some(system),
                    format!("{}SYSTEM{}", &text[..body], &text[end..]),
                )
            }
            _ => (None, text),
        };
        let squeezed = squeeze(&text);
        let with_system = CHATML.replacen("%}", &format!("%}}{DEFAULT_SYSTEM}"), 1);
        match (&default_system, squeezed.as_str()) {
            (None, s) if s == CHATML => Ok(Self {
                form: ChatForm::ChatMl,
                default_system,
            }),
            (Some(_), s) if s == with_system => Ok(Self {
                form: ChatForm::ChatMl,
                default_system,
            }),
            _ => Err(unrenderable(template, "not the ChatML form")),
        }
    }

    /// Recognises Gemma's turn format (`text`: `template` with newlines and quotes
    /// normalised): every one of [`GEMMA_PARTS`], newlines kept inside the literals.
    fn parse_gemma(template: &str, text: &str) -> Result<Self, GenerateError> {
        let squeezed = squeeze(text);
        // Outside string literals Jinja's layout is free: drop the newlines between tags.
        let squeezed = squeezed
            .replace("%}\n", "%}")
            .replace("}}\n", "}}")
            .replace("\n{%", "{%")
            .replace("\n{{", "{{");
        match GEMMA_PARTS.iter().find(|part| !squeezed.contains(**part)) {
            Some(missing) => Err(unrenderable(
                template,
                &format!("a <start_of_turn> template without Gemma's {missing:?}"),
            )),
            None => Ok(Self {
                form: ChatForm::Gemma {
                    trim: squeezed.contains("|trim"),
                },
                default_system: None,
            }),
        }
    }

    /// Text the model writes when its turn is over, to stop generating at: Gemma's
    /// `<end_of_turn>` (its files' end-of-sequence token is `<eos>`, which an
    /// instruction-tuned Gemma does not write at the end of a turn); ChatML models end
    /// with their EOS (`<|im_end|>`).
    pub fn end_of_turn(&self) -> Option<&'static str> {
        match self.form {
            ChatForm::ChatMl => None,
            ChatForm::Gemma { .. } => Some("<end_of_turn>"),
        }
    }

    /// The prompt for one user message, ready for the assistant's answer.
    pub fn render_user(&self, user: &str) -> String {
        if let ChatForm::Gemma { trim } = self.form {
            let user = if trim { user.trim() } else { user };
            return format!("<start_of_turn>user\n{user}<end_of_turn>\n<start_of_turn>model\n");
        }
        let mut text = String::new();
        if let Some(system) = &self.default_system {
            text += &format!("<|im_start|>system\n{system}<|im_end|>\n");
        }
        text + &format!("<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")
    }
}

/// `text` without spaces, tabs, carriage returns and Jinja's `-` trim marks.
fn squeeze(text: &str) -> String {
    text.replace("{%-", "{%")
        .replace("-%}", "%}")
        .replace("{{-", "{{")
        .replace("-}}", "}}")
        .chars()
        .filter(|c| *c != ' ' && *c != '\t' && *c != '\r')
        .collect()
}

fn unrenderable(template: &str, why: &str) -> GenerateError {
    let head: String = template.chars().take(80).collect();
    GenerateError::ChatTemplate {
        reason: format!("{why}: {head:?}…"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn smollm2s_template_renders_with_its_default_system() {
        let t = ChatTemplate::parse(SMOLLM2).unwrap();
        assert_eq!(
            t.render_user("Hi"),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by \
             Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn plain_chatml_with_escaped_newlines_renders() {
        let plain = "{%- for message in messages %}{{ \"<|im_start|>\" + message['role'] + \"\\n\" + message['content'] + \"<|im_end|>\" + \"\\n\" }}{%- endfor %}{% if add_generation_prompt %}{{ \"<|im_start|>assistant\\n\" }}{% endif %}";
        let t = ChatTemplate::parse(plain).unwrap();
        assert_eq!(t.default_system, None);
        assert_eq!(
            t.render_user("x"),
            "<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    /// Gemma 3's instruction-tuned template (`google/gemma-3-270m-it`,
    /// `tokenizer_config.json`), its newlines as the JSON string decodes them.
    const GEMMA3: &str = "{{ bos_token }}\n{%- if messages[0]['role'] == 'system' -%}\n    {%- if messages[0]['content'] is string -%}\n        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n    {%- else -%}\n        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n    {%- endif -%}\n    {%- set loop_messages = messages[1:] -%}\n{%- else -%}\n    {%- set first_user_prefix = \"\" -%}\n    {%- set loop_messages = messages -%}\n{%- endif -%}\n{%- for message in loop_messages -%}\n    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n    {%- endif -%}\n    {%- if (message['role'] == 'assistant') -%}\n        {%- set role = \"model\" -%}\n    {%- else -%}\n        {%- set role = message['role'] -%}\n    {%- endif -%}\n    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n    {%- if message['content'] is string -%}\n        {{ message['content'] | trim }}\n    {%- elif message['content'] is iterable -%}\n        {%- for item in message['content'] -%}\n            {%- if item['type'] == 'image' -%}\n                {{ '<start_of_image>' }}\n            {%- elif item['type'] == 'text' -%}\n                {{ item['text'] | trim }}\n            {%- endif -%}\n        {%- endfor -%}\n    {%- else -%}\n        {{ raise_exception(\"Invalid content type\") }}\n    {%- endif -%}\n    {{ '<end_of_turn>\n' }}\n{%- endfor -%}\n{%- if add_generation_prompt -%}\n    {{'<start_of_turn>model\n'}}\n{%- endif -%}\n";

    #[test]
    fn gemmas_template_renders_its_turns() {
        // As stored (real newlines), and with Jinja's escaped `\n` in the literals.
        let escaped = GEMMA3
            .replace("'\n'", "'\\n'")
            .replace(">\n'", ">\\n'")
            .replace("model\n'", "model\\n'");
        assert_ne!(escaped, GEMMA3);
        for template in [GEMMA3, escaped.as_str()] {
            let t = ChatTemplate::parse(template).unwrap();
            assert_eq!(t.form, ChatForm::Gemma { trim: true });
            assert_eq!(
                t.render_user("  What is 2+2?\n"),
                "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n"
            );
            assert_eq!(t.end_of_turn(), Some("<end_of_turn>"));
        }
        // A <start_of_turn> template that is not Gemma's (no `model` role) is refused,
        // naming what is missing.
        let other = GEMMA3.replace("\"model\"", "\"bot\"");
        let err = ChatTemplate::parse(&other).unwrap_err().to_string();
        assert!(err.contains("setrole='model'"), "{err}");
        assert_eq!(ChatTemplate::parse(CHATML).unwrap().end_of_turn(), None);
    }

    #[test]
    fn a_rendered_gemma_prompt_tokenizes_its_turn_markers_as_control_ids() {
        use hetsched_import::GgufTokenizer;
        use hetsched_import::gguf::GgufFile;
        use hetsched_import::gguf::writer::GgufWriter;
        // A SentencePiece vocabulary: BOS and the two turn markers (control), one token
        // per letter, a newline byte token.
        let mut pieces = vec![
            ("<bos>", 0.0, 3),
            ("<start_of_turn>", 0.0, 3),
            ("<end_of_turn>", 0.0, 3),
        ];
        let letters = ["u", "s", "e", "r", "m", "o", "d", "l", "H", "i"];
        pieces.extend(letters.iter().map(|l| (*l, 0.0, 1)));
        pieces.push(("<0x0A>", 0.0, 6));
        let mut w = GgufWriter::new();
        w.spm_vocabulary(&pieces);
        let file = GgufFile::from_bytes(w.to_bytes()).unwrap();
        let tok = GgufTokenizer::from_gguf(&file).unwrap();
        let text = ChatTemplate::parse(GEMMA3).unwrap().render_user("Hi");
        let id = |piece: &str| pieces.iter().position(|p| p.0 == piece).unwrap() as u32;
        let spelled = |word: &str| word.chars().map(|c| id(&c.to_string())).collect::<Vec<_>>();
        let (sot, eot, nl) = (id("<start_of_turn>"), id("<end_of_turn>"), id("<0x0A>"));
        let mut want = vec![0, sot];
        want.extend(spelled("user"));
        want.push(nl);
        want.extend(spelled("Hi"));
        want.extend([eot, nl, sot]);
        want.extend(spelled("model"));
        want.push(nl);
        assert_eq!(tok.encode_special(&text).unwrap(), want);
        // Plain `encode` spells the markers out (llama-perplexity's behaviour).
        assert!(!tok.encode(&text).unwrap().contains(&sot));
    }

    #[test]
    fn another_template_is_refused_by_name() {
        let llama3 = "{% for message in messages %}{{ '<|start_header_id|>' + message['role'] }}{% endfor %}";
        let err = ChatTemplate::parse(llama3).unwrap_err();
        assert!(err.to_string().contains("start_header_id"), "{err}");
    }
}
