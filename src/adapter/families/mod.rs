//! One module per agent family: each implements [`super::family::AgentFamily`] over its
//! protocol's driver and translator (the protocol modules beside this folder).

pub mod acp;
pub mod claude;
pub mod codex;
pub mod gemini;
pub mod gemini_acp;
pub mod opencode;
