//! Running the selected built-in templates: each flavour's renderer, merged
//! in order. Above the template vocabulary (`template.rs`) and the flavours
//! that use it (`sidecar.rs`, `gateway.rs`, `grpc.rs`).

use super::template::{Rendered, Template, TemplateInput};
use super::{gateway, grpc, sidecar};

fn render(template: Template, t: &TemplateInput<'_>) -> Rendered {
    match template {
        Template::Sidecar => sidecar::render(t),
        Template::Gateway => gateway::render(t),
        Template::GrpcSimple => grpc::render_simple(t),
        Template::GrpcAgent => grpc::render_agent(t),
    }
}

/// Renders the templates in order, each merged over the previous ones.
pub(crate) fn render_all(templates: &[Template], t: &TemplateInput<'_>) -> Rendered {
    let mut out = Rendered::default();
    for template in templates {
        out.merge(render(*template, t));
    }
    out
}
