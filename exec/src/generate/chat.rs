//! The model's chat template (`tokenizer.chat_template`, Jinja) for the one form this
//! tool renders: ChatML, `<|im_start|>{role}\n{content}<|im_end|>\n` per message then
//! `<|im_start|>assistant\n`, optionally with a default system message when the first
//! message is not one (SmolLM2's template). The template is recognised, not interpreted:
//! its text, without whitespace and with the default system message cut out, must be the
//! ChatML loop; anything else is refused with the template's beginning in the error.

use super::error::GenerateError;

/// The ChatML loop and generation prompt, whitespace and Jinja's `-` trim marks removed.
const CHATML: &str = "{%formessageinmessages%}{{'<|im_start|>'+message['role']+'\n'+message['content']+'<|im_end|>'+'\n'}}{%endfor%}{%ifadd_generation_prompt%}{{'<|im_start|>assistant\n'}}{%endif%}";

/// SmolLM2's default-system block (with its message cut out as `SYSTEM`), inserted after
/// the loop's opening.
const DEFAULT_SYSTEM: &str = "{%ifloop.firstandmessages[0]['role']!='system'%}{{'<|im_start|>system\nSYSTEM<|im_end|>\n'}}{%endif%}";

/// A recognised chat template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatTemplate {
    /// The system message the template adds when the conversation starts without one.
    pub default_system: Option<String>,
}

impl ChatTemplate {
    /// Recognises `template` (the `tokenizer.chat_template` text).
    pub fn parse(template: &str) -> Result<Self, GenerateError> {
        // Jinja string literals may spell a newline as the escape `\n`.
        let text = template.replace("\\n", "\n").replace('"', "'");
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
        let squeezed: String = text
            .replace("{%-", "{%")
            .replace("-%}", "%}")
            .replace("{{-", "{{")
            .replace("-}}", "}}")
            .chars()
            .filter(|c| *c != ' ' && *c != '\t' && *c != '\r')
            .collect();
        let with_system = CHATML.replacen("%}", &format!("%}}{DEFAULT_SYSTEM}"), 1);
        match (&default_system, squeezed.as_str()) {
            (None, s) if s == CHATML => Ok(Self { default_system }),
            (Some(_), s) if s == with_system => Ok(Self { default_system }),
            _ => Err(unrenderable(template, "not the ChatML form")),
        }
    }

    /// The prompt for one user message, ready for the assistant's answer.
    pub fn render_user(&self, user: &str) -> String {
        let mut text = String::new();
        if let Some(system) = &self.default_system {
            text += &format!("<|im_start|>system\n{system}<|im_end|>\n");
        }
        text + &format!("<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")
    }
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

    #[test]
    fn another_template_is_refused_by_name() {
        let llama3 = "{% for message in messages %}{{ '<|start_header_id|>' + message['role'] }}{% endfor %}";
        let err = ChatTemplate::parse(llama3).unwrap_err();
        assert!(err.to_string().contains("start_header_id"), "{err}");
    }
}
