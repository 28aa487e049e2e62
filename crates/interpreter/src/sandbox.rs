//! The Lua state a script runs in: Karmada's sandbox. Base, `table`, `math`, a `string`
//! without `gsub`, `rep` and `dump` and with a limit on the strings it reads, `os.time` and
//! `os.date` only, and `require` that knows `kube` alone. The base functions Karmada blocks
//! (`load`, `setmetatable`, `rawget`, ...) exist and raise its message. No `io`, `debug`,
//! `coroutine` or `package`. Each call has a deadline (checked every thousand instructions)
//! and a memory limit; `print` writes nothing (a server's output is its logs).

use std::time::{Duration, Instant};

use mlua::{
    Function, HookTriggers, Lua, LuaOptions, MultiValue, StdLib, Value as LuaValue, VmState,
};

/// What one call may take.
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    /// Wall time of a call: loading the script and calling its function (Karmada: 1 s).
    pub time: Duration,
    /// Bytes the state may allocate.
    pub memory: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            time: Duration::from_secs(1),
            memory: 64 << 20,
        }
    }
}

/// Base functions Karmada replaces with ones that raise.
const BLOCKED: &[&str] = &[
    "collectgarbage",
    "dofile",
    "getfenv",
    "getmetatable",
    "load",
    "loadfile",
    "loadstring",
    "rawequal",
    "rawget",
    "rawset",
    "setfenv",
    "setmetatable",
    "module",
    "newproxy",
];

/// String functions whose string arguments are limited in length.
const LIMITED: &[&str] = &[
    "byte", "find", "format", "gmatch", "lower", "match", "reverse", "sub", "upper",
];

/// Longest string the string library reads (Karmada's limit).
const MAX_STRING: usize = 1_000_000;

/// A fresh sandboxed state; the deadline starts now.
pub fn state(limits: Limits) -> mlua::Result<Lua> {
    let lua = Lua::new_with(
        StdLib::TABLE | StdLib::STRING | StdLib::MATH | StdLib::OS,
        LuaOptions::default(),
    )?;
    let g = lua.globals();
    // Lua 5.1's base library brings coroutines and gcinfo along; Karmada's has neither.
    g.set("coroutine", LuaValue::Nil)?;
    g.set("gcinfo", LuaValue::Nil)?;
    // os: the clock and dates only.
    let os: mlua::Table = g.get("os")?;
    let safe_os = lua.create_table()?;
    safe_os.set("time", os.get::<Function>("time")?)?;
    safe_os.set("date", os.get::<Function>("date")?)?;
    g.set("os", safe_os)?;
    let string: mlua::Table = g.get("string")?;
    for name in ["gsub", "rep", "dump"] {
        let msg = format!(
            "The Lua function string.{name} is not supported by Karmada. If you believe this \
             function is essential for your use case, please submit an issue to let us know why \
             you need it."
        );
        string.set(
            name,
            lua.create_function(move |_, _: MultiValue| -> mlua::Result<()> {
                Err(mlua::Error::runtime(msg.clone()))
            })?,
        )?;
    }
    for name in LIMITED {
        let Ok(f) = string.get::<Function>(*name) else {
            continue;
        };
        string.set(
            *name,
            lua.create_function(move |_, args: MultiValue| {
                for a in args.iter() {
                    if let LuaValue::String(s) = a
                        && s.as_bytes().len() > MAX_STRING
                    {
                        return Err(mlua::Error::runtime(format!(
                            "string length {} exceeds the maximum allowed input string length \
                             {MAX_STRING} in Karmada lua string lib, please check your lua script.",
                            s.as_bytes().len()
                        )));
                    }
                }
                f.call::<MultiValue>(args)
            })?,
        )?;
    }
    for name in BLOCKED {
        let msg = format!(
            "call function {name} is not supported in karmada customized resourceinterpreter."
        );
        g.set(
            *name,
            lua.create_function(move |_, _: MultiValue| -> mlua::Result<()> {
                Err(mlua::Error::runtime(msg.clone()))
            })?,
        )?;
    }
    g.set("print", lua.create_function(|_, _: MultiValue| Ok(()))?)?;
    let kube = crate::kube::library(&lua)?;
    g.set(
        "require",
        lua.create_function(move |_, name: String| {
            if name == "kube" {
                Ok(kube.clone())
            } else {
                Err(mlua::Error::runtime(format!(
                    "module {name} not found:\n\tno field package.preload['{name}']"
                )))
            }
        })?,
    )?;
    lua.set_memory_limit(limits.memory)?;
    let deadline = Instant::now() + limits.time;
    // A protected call does not keep a script past its deadline: the deadline's error is
    // raised again where the protected call returns.
    for name in ["pcall", "xpcall"] {
        let protected: Function = g.get(name)?;
        g.set(
            name,
            lua.create_function(move |_, args: MultiValue| {
                let out = protected.call::<MultiValue>(args)?;
                if Instant::now() >= deadline
                    && matches!(out.front(), Some(LuaValue::Boolean(false)))
                {
                    return Err(mlua::Error::runtime("context deadline exceeded"));
                }
                Ok(out)
            })?,
        )?;
    }
    lua.set_hook(
        HookTriggers::new().every_nth_instruction(1000),
        move |_, _| {
            if Instant::now() >= deadline {
                Err(mlua::Error::runtime("context deadline exceeded"))
            } else {
                Ok(VmState::Continue)
            }
        },
    )?;
    Ok(lua)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(lua: &Lua, script: &str) -> String {
        lua.load(script).exec().unwrap_err().to_string()
    }

    #[test]
    fn the_sandbox_leaves_out_what_karmadas_leaves_out() {
        let lua = state(Limits::default()).unwrap();
        let (io, debug, coroutine, package, exec): (
            LuaValue,
            LuaValue,
            LuaValue,
            LuaValue,
            LuaValue,
        ) = lua
            .load("return io, debug, coroutine, package, os.execute")
            .eval()
            .unwrap();
        assert!(
            io.is_nil()
                && debug.is_nil()
                && coroutine.is_nil()
                && package.is_nil()
                && exec.is_nil()
        );
        let t: f64 = lua.load("return os.time()").eval().unwrap();
        assert!(t > 1.7e9);
        assert!(err(&lua, "setmetatable({}, {})").contains(
            "call function setmetatable is not supported in karmada customized resourceinterpreter."
        ));
        assert!(err(&lua, "loadstring('return 1')").contains("loadstring is not supported"));
        assert!(
            err(&lua, "string.gsub('a', 'a', 'b')")
                .contains("string.gsub is not supported by Karmada")
        );
        assert!(err(&lua, "return ('a'):rep(3)").contains("string.rep is not supported"));
        assert!(err(&lua, "require('os')").contains("module os not found"));
        let up: String = lua.load("return ('abc'):upper()").eval().unwrap();
        assert_eq!(up, "ABC");
        let kube: LuaValue = lua
            .load("return require('kube').resourceAdd")
            .eval()
            .unwrap();
        assert!(kube.is_function());
    }

    #[test]
    fn long_strings_and_loops_and_allocations_are_stopped() {
        let lua = state(Limits::default()).unwrap();
        let long = "x".repeat(MAX_STRING + 1);
        lua.globals().set("s", long).unwrap();
        assert!(
            err(&lua, "return s:upper()")
                .contains("exceeds the maximum allowed input string length 1000000")
        );
        let lua = state(Limits {
            time: Duration::from_millis(50),
            ..Limits::default()
        })
        .unwrap();
        assert!(err(&lua, "while true do end").contains("context deadline exceeded"));
        // pcall does not keep a script past its deadline: the next instructions raise again.
        assert!(
            err(
                &lua,
                "while true do pcall(function() while true do end end) end"
            )
            .contains("context deadline exceeded")
        );
        let lua = state(Limits {
            memory: 4 << 20,
            ..Limits::default()
        })
        .unwrap();
        let e = err(&lua, "local t = {} for i = 1, 1e8 do t[i] = i end");
        assert!(e.contains("memory"), "{e}");
    }
}
