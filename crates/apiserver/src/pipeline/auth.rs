//! Steps 2 and 5: who asks. Credentials are read once ([`identify`]); the refusal of those
//! that name nobody waits until the public routes have been passed ([`authenticate`]).

use std::sync::Arc;

use super::{Acting, Answer, Caller, Identified, Next, Req, refuse};
use crate::app::App;
use crate::impersonation::Impersonated;

pub(super) async fn identify(app: Arc<App>, mut req: Req, next: Next) -> Answer {
    let found = app.authenticate(req.headers(), req.extensions());
    req.extensions_mut().insert(Identified(found));
    next.run(req).await
}

pub(super) async fn authenticate(app: Arc<App>, mut req: Req, next: Next) -> Answer {
    let path = req.uri().path().to_string();
    let found = match req.extensions_mut().remove::<Identified>() {
        Some(Identified(found)) => found,
        None => app.authenticate(req.headers(), req.extensions()),
    };
    let who = match found {
        Ok(who) => who,
        Err(e) => return refuse(&path, &e),
    };
    crate::trace::step("authenticated");
    // Acting as someone else (Impersonate-*), when the caller may; never as the caller
    // instead.
    let (acting, impersonated) =
        match crate::impersonation::apply(&app.authz, who.clone(), req.headers()) {
            Ok(w) => w,
            Err(e) => return with_caller(refuse(&path, &e), who.user()),
        };
    let user = match &impersonated {
        Some(Impersonated { by: Some(by), .. }) => format!("{} (as {})", by.user(), acting.user()),
        _ => acting.user(),
    };
    req.extensions_mut().insert(Acting {
        who: acting,
        impersonated,
    });
    with_caller(next.run(req).await, user)
}

fn with_caller(mut answer: Answer, user: String) -> Answer {
    answer.extensions_mut().insert(Caller(user));
    answer
}
