#!lua
-- KEYS[1]: the scope's fence hash; KEYS[1 + j]: the key of condition j; KEYS[1 + conditions + i]:
-- the key of op i. ARGV[1..5]: binding (the lock, or a permit's lock U+001F slot), token,
-- session, fence key prefix, number of conditions; then kind and value of each condition, then
-- kind and value of each op. The session is 's' for a shared grant (a reader of a read-write
-- lock's shared phase): it stores holder 0 ("a shared phase"), is accepted again at an equal
-- token only while the stored holder is 0, and may only read (GET ops, no conditions).
--
-- Redis does not roll a script back when a command in it fails, so everything that could fail
-- is checked before the first write: then the ops and the advance happen all or not at all.
-- The shebang (no flags) makes Redis refuse the whole script up front when it is out of memory
-- or is a replica, instead of failing at its first write.
local lock, token, session, prefix = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local conditions = tonumber(ARGV[5])
local ops = #KEYS - 1 - conditions
local shared = session == 's'
if shared then session = '0' end
-- A shared grant's request writes if it has a condition (a compare-and-set) or any op but GET.
local shared_write = false
if shared then
  shared_write = conditions > 0
  for i = 1, ops do
    if ARGV[5 + 2 * conditions + 2 * i - 1] ~= 'get' then shared_write = true end
  end
end

-- Canonical decimals, compared as text (length, then bytes): Lua numbers are doubles and cannot
-- hold every 64-bit integer exactly.
local TOKEN_MAX, SESSION_MAX = '9223372036854775807', '18446744073709551615'
local INT_MAX, INT_MIN_MAGNITUDE = '9223372036854775807', '9223372036854775808'
local function at_most(digits, max)
  return #digits < #max or (#digits == #max and digits <= max)
end
local function canonical_unsigned(text, max)
  return (text == '0' or string.match(text, '^[1-9][0-9]*$') ~= nil) and at_most(text, max)
end

local fence = redis.pcall('HMGET', KEYS[1], 'lock', 'token', 'session')
if fence.err then
  if string.find(fence.err, 'WRONGTYPE', 1, true) then
    return {'corrupt', 'the fence key is not a hash: ' .. fence.err}
  end
  return fence -- any other error (a permission, say) is the server's, passed on as it is
end
if fence[1] or fence[2] or fence[3] then
  if not (fence[1] and fence[2] and fence[3]) then
    return {'corrupt', 'the fence hash lacks its lock, token or session'}
  end
  if fence[2] == '0' or not canonical_unsigned(fence[2], TOKEN_MAX) then
    return {'corrupt', 'the stored token ' .. fence[2] .. ' is not a canonical decimal in 1..=' .. TOKEN_MAX}
  end
  if not canonical_unsigned(fence[3], SESSION_MAX) then
    return {'corrupt', 'the stored session ' .. fence[3] .. ' is not a canonical decimal'}
  end
  if fence[1] ~= lock then
    return {'wrong_lock', fence[1]}
  end
end
if shared_write then
  return {'shared_write'}
end
if fence[2] then
  local accepted = fence[2]
  if #token < #accepted or (#token == #accepted and token < accepted) then
    return {'stale', accepted, fence[3]}
  end
  -- One grant has one session (a shared phase holder 0): the accepted token from another was
  -- issued twice.
  if token == accepted and session ~= fence[3] then
    return {'token_reissued', accepted, fence[3]}
  end
end

-- No key of the request may be a fence hash, this scope's or another's.
for i = 2, #KEYS do
  if string.sub(KEYS[i], 1, #prefix) == prefix then
    return {'reserved_key', KEYS[i]}
  end
end

-- Signed 64-bit integers as (negative, magnitude) with the magnitude a canonical decimal, as
-- Redis parses them for INCRBY ('0', or an optional '-' and no leading zero).
local function parse_int(text)
  if text == '0' then return false, '0' end
  local negative = string.sub(text, 1, 1) == '-'
  local magnitude = negative and string.sub(text, 2) or text
  if not string.match(magnitude, '^[1-9][0-9]*$') then return nil end
  if not at_most(magnitude, negative and INT_MIN_MAGNITUDE or INT_MAX) then return nil end
  return negative, magnitude
end
local function compare(a, b)
  if #a ~= #b then return #a < #b and -1 or 1 end
  if a == b then return 0 end
  return a < b and -1 or 1
end
local function digits_add(a, b)
  local out, carry, i, j = {}, 0, #a, #b
  while i > 0 or j > 0 or carry > 0 do
    local sum = carry
    if i > 0 then sum = sum + string.byte(a, i) - 48 end
    if j > 0 then sum = sum + string.byte(b, j) - 48 end
    table.insert(out, 1, string.char(48 + sum % 10))
    carry = math.floor(sum / 10)
    i, j = i - 1, j - 1
  end
  return table.concat(out)
end
local function digits_sub(a, b) -- a >= b
  local out, borrow, i, j = {}, 0, #a, #b
  while i > 0 do
    local diff = string.byte(a, i) - 48 - borrow
    if j > 0 then diff = diff - (string.byte(b, j) - 48) end
    if diff < 0 then diff, borrow = diff + 10, 1 else borrow = 0 end
    table.insert(out, 1, string.char(48 + diff))
    i, j = i - 1, j - 1
  end
  local text = string.gsub(table.concat(out), '^0+', '')
  if text == '' then return '0' end
  return text
end
-- The exact sum as a canonical decimal, or nil when it leaves the signed 64-bit range.
local function int_add(a_negative, a, b_negative, b)
  local negative, magnitude
  if a_negative == b_negative then
    negative, magnitude = a_negative, digits_add(a, b)
  else
    local order = compare(a, b)
    if order == 0 then return '0' end
    if order > 0 then negative, magnitude = a_negative, digits_sub(a, b)
    else negative, magnitude = b_negative, digits_sub(b, a) end
  end
  if not at_most(magnitude, negative and INT_MIN_MAGNITUDE or INT_MAX) then return nil end
  if negative then return '-' .. magnitude end
  return magnitude
end

-- Conditions hold against the data as it is before this request.
for j = 1, conditions do
  local key, kind, value = KEYS[1 + j], ARGV[4 + 2 * j], ARGV[5 + 2 * j]
  local now = redis.call('TYPE', key)['ok']
  local current = false
  if now == 'string' then current = redis.call('GET', key) end
  local holds
  if kind == 'equals' then
    holds = current == value
  elseif kind == 'absent' then
    holds = now == 'none'
  else
    return {'invalid', 'unknown condition ' .. tostring(kind)}
  end
  if not holds then
    return {'compare_failed', tostring(j - 1), current}
  end
end

-- Every op is checked against the key's type (and, for INCRBY, its value) as the ops before it
-- in this request leave it, so a batch that cannot apply in full is refused before any write.
local types, integers, sums = {}, {}, {}
local function type_of(key)
  if types[key] == nil then types[key] = redis.call('TYPE', key)['ok'] end
  return types[key]
end
local arg0 = 5 + 2 * conditions
for i = 1, ops do
  local key, kind, value = KEYS[1 + conditions + i], ARGV[arg0 + 2 * i - 1], ARGV[arg0 + 2 * i]
  local now = type_of(key)
  if kind == 'set' then
    types[key], integers[key] = 'string', value
  elseif kind == 'del' then
    types[key], integers[key] = 'none', nil
  elseif kind == 'get' then
    if now ~= 'none' and now ~= 'string' then
      return {'wrong_type', tostring(i - 1), key, now, 'string'}
    end
  elseif kind == 'rpush' then
    if now ~= 'none' and now ~= 'list' then
      return {'wrong_type', tostring(i - 1), key, now, 'list'}
    end
    types[key] = 'list'
  elseif kind == 'incrby' then
    if now ~= 'none' and now ~= 'string' then
      return {'wrong_type', tostring(i - 1), key, now, 'string'}
    end
    local current = '0'
    if now == 'string' then
      if integers[key] == nil then integers[key] = redis.call('GET', key) end
      current = integers[key]
    end
    local current_negative, current_magnitude = parse_int(current)
    if current_negative == nil then
      return {'not_integer', tostring(i - 1), key}
    end
    local delta_negative, delta_magnitude = parse_int(value)
    if delta_negative == nil then
      return {'invalid', 'op ' .. (i - 1) .. ' has a delta that is not a 64-bit integer'}
    end
    local sum = int_add(current_negative, current_magnitude, delta_negative, delta_magnitude)
    if not sum then
      return {'overflow', tostring(i - 1), key}
    end
    types[key], integers[key], sums[i] = 'string', sum, sum
  else
    return {'invalid', 'unknown op ' .. tostring(kind)}
  end
end

-- Redis checks permissions (ACLs) command by command inside a script: a write refused half way
-- would leave the writes before it applied and the token not advanced. Ask first, for every
-- write and for the fence's own.
if not redis.acl_check_cmd('HSET', KEYS[1], 'lock', lock, 'token', token, 'session', session) then
  return {'invalid', 'this connection may not write the fence hash ' .. KEYS[1]}
end
for i = 1, ops do
  local key, kind, value = KEYS[1 + conditions + i], ARGV[arg0 + 2 * i - 1], ARGV[arg0 + 2 * i]
  local allowed
  if kind == 'set' then
    allowed = redis.acl_check_cmd('SET', key, value)
  elseif kind == 'del' then
    allowed = redis.acl_check_cmd('DEL', key)
  elseif kind == 'get' then
    allowed = redis.acl_check_cmd('GET', key)
  elseif kind == 'rpush' then
    allowed = redis.acl_check_cmd('RPUSH', key, value)
  else
    allowed = redis.acl_check_cmd('INCRBY', key, value)
  end
  if not allowed then
    return {'invalid', 'this connection may not ' .. kind .. ' ' .. key .. ' (op ' .. (i - 1) .. ')'}
  end
end

-- Apply. Each op's reply is a kind and a value: integers travel as decimal text, exact.
local reply = {'ok'}
for i = 1, ops do
  local key, kind, value = KEYS[1 + conditions + i], ARGV[arg0 + 2 * i - 1], ARGV[arg0 + 2 * i]
  if kind == 'set' then
    redis.call('SET', key, value)
    table.insert(reply, 'done')
    table.insert(reply, '')
  elseif kind == 'del' then
    table.insert(reply, 'int')
    table.insert(reply, string.format('%d', redis.call('DEL', key)))
  elseif kind == 'get' then
    table.insert(reply, 'value')
    table.insert(reply, redis.call('GET', key))
  elseif kind == 'rpush' then
    table.insert(reply, 'int')
    table.insert(reply, string.format('%d', redis.call('RPUSH', key, value)))
  else
    -- INCRBY's own reply passes through a Lua double; the exact sum was computed above.
    redis.call('INCRBY', key, value)
    table.insert(reply, 'int')
    table.insert(reply, sums[i])
  end
end
redis.call('HSET', KEYS[1], 'lock', lock, 'token', token, 'session', session)
return reply
