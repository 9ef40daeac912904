# The key paths of a bridge's freeform `settings` that look like secrets written
# inline (`smtp.password`, `api_key`), at every nesting level and inside lists,
# for the module's assertion: such a value would land in the world-readable Nix
# store. Keys ending in `_file` name a file and are fine. Pure (builtins only):
#   nix-instantiate --eval --strict --json -E 'import ./secrets.nix { smtp.password = "x"; }'
settings:
let
  inherit (builtins) attrNames concatMap concatStringsSep isAttrs isList match;
  secretLike = k: match ".*(token|password|secret|key).*" k != null && match ".*_file" k == null;
  walk = path: v:
    if isAttrs v then
      concatMap
        (k:
          let p = path ++ [ k ]; in
          (if secretLike k && !(isAttrs v.${k}) then [ (concatStringsSep "." p) ] else [ ]) ++ walk p v.${k})
        (attrNames v)
    else if isList v then concatMap (walk path) v
    else [ ];
in
walk [ ] settings
