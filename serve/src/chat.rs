//! A conversation (`messages`) rendered in the model's chat template, in the two forms
//! [`ChatTemplate`] recognises. One user message renders exactly as
//! [`ChatTemplate::render_user`] renders it (what `hetsched generate --chat` prefills); a
//! conversation follows the same template's loop:
//! * ChatML: the template's default system message when the first message is not a
//!   system one, then `<|im_start|>{role}\n{content}<|im_end|>\n` per message, then
//!   `<|im_start|>assistant\n`;
//! * Gemma: an optional leading system message becomes the first user turn's prefix
//!   (`system + "\n\n"`); the rest must alternate user, assistant, user, ...; the
//!   assistant's role is written `model`; contents are trimmed where the template trims;
//!   then `<start_of_turn>model\n`.

use hetsched_exec::generate::{ChatForm, ChatTemplate};

use crate::error::ApiError;

/// Who wrote a message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Instructions (`system`, or OpenAI's newer `developer`).
    System,
    /// The person.
    User,
    /// The model, in earlier turns.
    Assistant,
}

impl Role {
    /// The role named `name`.
    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "system" | "developer" => Some(Role::System),
            "user" => Some(Role::User),
            "assistant" => Some(Role::Assistant),
            _ => None,
        }
    }

    fn chatml(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::User => "user",
            Role::Assistant => "assistant",
        }
    }
}

/// Renders `messages` (at least one) as the prompt for the assistant's next turn.
pub fn render(template: &ChatTemplate, messages: &[(Role, String)]) -> Result<String, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "messages is empty: give at least one message",
        ));
    }
    match template.form {
        ChatForm::ChatMl => Ok(render_chatml(template, messages)),
        ChatForm::Gemma { trim } => render_gemma(messages, trim),
    }
}

fn render_chatml(template: &ChatTemplate, messages: &[(Role, String)]) -> String {
    let mut text = String::new();
    if let Some(system) = &template.default_system
        && messages[0].0 != Role::System
    {
        text += &format!("<|im_start|>system\n{system}<|im_end|>\n");
    }
    for (role, content) in messages {
        text += &format!("<|im_start|>{}\n{content}<|im_end|>\n", role.chatml());
    }
    text + "<|im_start|>assistant\n"
}

fn render_gemma(messages: &[(Role, String)], trim: bool) -> Result<String, ApiError> {
    let (prefix, turns) = match messages.split_first() {
        Some(((Role::System, system), rest)) => (format!("{system}\n\n"), rest),
        _ => (String::new(), messages),
    };
    let mut text = String::new();
    for (i, (role, content)) in turns.iter().enumerate() {
        let expected = if i % 2 == 0 {
            Role::User
        } else {
            Role::Assistant
        };
        if *role != expected {
            return Err(ApiError::invalid(
                "messages",
                "this model's chat template needs roles to alternate user, assistant, user, \
                 ... after an optional first system message",
            ));
        }
        let name = if *role == Role::Assistant {
            "model"
        } else {
            "user"
        };
        let first = if i == 0 { prefix.as_str() } else { "" };
        let content = if trim { content.trim() } else { content };
        text += &format!("<start_of_turn>{name}\n{first}{content}<end_of_turn>\n");
    }
    if turns.is_empty() {
        return Err(ApiError::invalid(
            "messages",
            "a system message alone: give a user message after it",
        ));
    }
    Ok(text + "<start_of_turn>model\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    fn chatml() -> ChatTemplate {
        ChatTemplate::parse(SMOLLM2).unwrap()
    }

    fn gemma() -> ChatTemplate {
        ChatTemplate {
            form: ChatForm::Gemma { trim: true },
            default_system: None,
        }
    }

    #[test]
    fn one_user_message_renders_as_generate_chat_does() {
        for template in [chatml(), gemma()] {
            for user in ["Hi", "  What is 2+2?\n", ""] {
                let one = [(Role::User, user.to_string())];
                assert_eq!(render(&template, &one).unwrap(), template.render_user(user));
            }
        }
    }

    #[test]
    fn a_chatml_conversation_keeps_its_own_system_message() {
        let messages = [
            (Role::System, "Be brief.".to_string()),
            (Role::User, "Hi".to_string()),
            (Role::Assistant, "Hello.".to_string()),
            (Role::User, "Bye".to_string()),
        ];
        assert_eq!(
            render(&chatml(), &messages).unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
             <|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n\
             <|im_start|>assistant\n"
        );
    }

    #[test]
    fn gemma_folds_the_system_message_and_refuses_unordered_roles() {
        let messages = [
            (Role::System, "Be brief.".to_string()),
            (Role::User, " Hi ".to_string()),
            (Role::Assistant, "Hello.".to_string()),
            (Role::User, "Bye".to_string()),
        ];
        assert_eq!(
            render(&gemma(), &messages).unwrap(),
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n\
             Hello.<end_of_turn>\n<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
        );
        let two_users = [(Role::User, "a".to_string()), (Role::User, "b".to_string())];
        assert_eq!(
            render(&gemma(), &two_users).unwrap_err().param,
            Some("messages")
        );
        assert!(render(&gemma(), &[(Role::System, "s".into())]).is_err());
        assert!(render(&chatml(), &[]).is_err());
    }
}
